//! rustls's process-wide crypto provider, where the driver needs it.
//!
//! The driver builds its TLS settings with the provider this crate's feature names
//! (`tls-ring` or `tls-aws-lc-rs`), except in one mode: checking the server's certificate
//! against the CA without its host name (`ssl-mode=VERIFY_CA`), where it asks rustls for the
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
        "ssl-mode=VERIFY_CA",
    );
    #[cfg(all(feature = "tls-aws-lc-rs", not(feature = "tls-ring")))]
    lease_core::raw::tls::ensure_crypto_provider(
        || (rustls::crypto::aws_lc_rs::default_provider(), "aws-lc-rs"),
        "ssl-mode=VERIFY_CA",
    );
}
