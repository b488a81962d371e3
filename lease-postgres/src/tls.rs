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
    #[cfg(any(feature = "tls-ring", feature = "tls-aws-lc-rs"))]
    {
        if rustls::crypto::CryptoProvider::get_default().is_some() {
            return;
        }
        #[cfg(feature = "tls-ring")]
        let (provider, name) = (rustls::crypto::ring::default_provider(), "ring");
        #[cfg(not(feature = "tls-ring"))]
        let (provider, name) = (rustls::crypto::aws_lc_rs::default_provider(), "aws-lc-rs");
        // An error means another thread installed one meanwhile: that one is used.
        if provider.install_default().is_ok() {
            tracing::info!(
                provider = name,
                "installed rustls's process-wide crypto provider for sslmode=verify-ca (the \
                 application had installed none; to use another, install it before \
                 connecting)"
            );
        }
    }
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
