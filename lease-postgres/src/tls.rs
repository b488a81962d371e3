//! rustls's process-wide crypto provider, where the driver needs it.
//!
//! The driver builds its TLS settings with the provider this crate's feature names
//! (`tls-ring` or `tls-aws-lc-rs`), except in one mode: checking the server's certificate
//! against the CA without its host name (`sslmode=verify-ca`), where it asks rustls for the
//! process-wide provider, and rustls panics if none is installed and both ring and
//! aws-lc-rs are built in (an application's other dependencies may bring the other). So
//! before a connection in that mode: if the application installed a provider, it is used;
//! otherwise the built-in one is installed (ring when both are built) and that is logged.
//! An application that wants another installs it before connecting.

/// See the [module docs](self). Without a TLS feature, nothing.
pub(crate) fn ensure_crypto_provider() {
    #[cfg(feature = "tls-ring")]
    lease_core::raw::tls::ensure_crypto_provider(
        || (rustls::crypto::ring::default_provider(), "ring"),
        "sslmode=verify-ca",
    );
    #[cfg(all(feature = "tls-aws-lc-rs", not(feature = "tls-ring")))]
    lease_core::raw::tls::ensure_crypto_provider(
        || (rustls::crypto::aws_lc_rs::default_provider(), "aws-lc-rs"),
        "sslmode=verify-ca",
    );
}

/// [`ensure_crypto_provider`] if `pool` connects with `sslmode=verify-ca`.
pub(crate) fn ensure_crypto_provider_for(pool: &sqlx::PgPool) {
    if matches!(
        pool.connect_options().get_ssl_mode(),
        sqlx::postgres::PgSslMode::VerifyCa
    ) {
        ensure_crypto_provider();
    }
}
