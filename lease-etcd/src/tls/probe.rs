//! A TLS handshake of the backend's own, to say why a TLS connection to etcd failed.
//!
//! gRPC over HTTP/2 reports a connection that the server closed in or right after the
//! TLS handshake as "connection closed" or "broken pipe", without the TLS alert behind
//! it. In TLS 1.3 the server judges the client's certificate after the client has
//! finished its side of the handshake, so its verdict (certificate required, bad
//! certificate, unknown CA) arrives as an alert on the first read. This probe makes the
//! same handshake with the same files, reads once, and returns what rustls saw.

use std::sync::Arc;
use std::time::Duration;

use lease_core::raw::tls::TlsPem;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Why a TLS connection to `endpoint` (`https://host:port`) fails, as
/// [`lease_core::raw::tls::tls_failure`] words it; `None` when the probe sees no TLS failure (or
/// cannot run: then the caller's own error stands).
pub(crate) async fn diagnose(endpoint: &str, pem: &TlsPem, bound: Duration) -> Option<String> {
    let authority = endpoint.strip_prefix("https://")?;
    let (host, port) = authority.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let config = client_config(pem)?;
    let sent = pem.identity.is_some();
    let server_name = ServerName::try_from(host.clone()).ok()?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let probe = async move {
        let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .ok()?;
        let mut stream = match connector.connect(server_name, tcp).await {
            Ok(stream) => stream,
            Err(e) => return lease_core::raw::tls::tls_failure_for(&e, Some(sent)),
        };
        // The HTTP/2 preface: a server that accepted us answers with its settings.
        if let Err(e) = stream.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await {
            return lease_core::raw::tls::tls_failure_for(&e, Some(sent));
        }
        let mut byte = [0u8; 1];
        match stream.read(&mut byte).await {
            Err(e) => lease_core::raw::tls::tls_failure_for(&e, Some(sent)),
            Ok(_) => None,
        }
    };
    tokio::time::timeout(bound, probe).await.ok().flatten()
}

fn client_config(pem: &TlsPem) -> Option<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    match &pem.ca {
        Some(ca) => {
            for cert in CertificateDer::pem_slice_iter(ca) {
                roots.add(cert.ok()?).ok()?;
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
    }
    // The provider the gRPC client uses too: the application's, if it installed one,
    // else the one this crate was built with (ring when both are). Never installed here.
    let provider = match rustls::crypto::CryptoProvider::get_default() {
        Some(installed) => installed.clone(),
        #[cfg(feature = "tls-ring")]
        None => Arc::new(rustls::crypto::ring::default_provider()),
        #[cfg(not(feature = "tls-ring"))]
        None => Arc::new(rustls::crypto::aws_lc_rs::default_provider()),
    };
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .ok()?
        .with_root_certificates(roots);
    let mut config = match &pem.identity {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<Vec<_>, _>>()
                .ok()?;
            let key = PrivateKeyDer::from_pem_slice(key).ok()?;
            builder.with_client_auth_cert(chain, key).ok()?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Some(config)
}
