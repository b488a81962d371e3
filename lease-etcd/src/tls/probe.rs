//! A TLS handshake of the backend's own, to say why a TLS connection to etcd failed.
//!
//! gRPC over HTTP/2 reports a connection that the server closed in or right after the
//! TLS handshake as "connection closed" or "broken pipe", without the TLS alert behind
//! it. In TLS 1.3 the server judges the client's certificate after the client has
//! finished its side of the handshake, so its verdict (certificate required, bad
//! certificate, unknown CA) arrives as an alert on the first read. This probe makes the
//! same handshake with the same files (lease-core's `probe_handshake`), sends the HTTP/2
//! preface, reads once, and returns what rustls saw.

use std::time::Duration;

use lease_core::raw::tls::TlsPem;

/// Why a TLS connection to `endpoint` (`https://host:port`) fails, as
/// [`lease_core::raw::tls::tls_failure`] words it; `None` when the probe sees no TLS failure (or
/// cannot run: then the caller's own error stands).
pub(crate) async fn diagnose(endpoint: &str, pem: &TlsPem, bound: Duration) -> Option<String> {
    let authority = endpoint.strip_prefix("https://")?;
    let (host, port) = authority.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    // The provider the gRPC client uses too: the application's, if it installed one,
    // else the one this crate was built with (ring when both are). Never installed here.
    let mut config = lease_core::raw::tls::client_config(
        pem,
        || {
            #[cfg(feature = "tls-ring")]
            return rustls::crypto::ring::default_provider();
            #[cfg(not(feature = "tls-ring"))]
            return rustls::crypto::aws_lc_rs::default_provider();
        },
        || rustls_native_certs::load_native_certs().certs,
    )?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    // The HTTP/2 preface: a server that accepted us answers with its settings.
    lease_core::raw::tls::probe_handshake(
        host,
        port,
        config,
        Some(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
        bound,
    )
    .await
}
