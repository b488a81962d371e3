//! TLS to etcd: the client's TLS options from the files of a [`TlsFiles`], and why a TLS
//! connection failed (a handshake of the backend's own, in `probe`).

use super::*;

#[cfg(feature = "_tls")]
mod probe;

/// `error`, or the TLS failure behind it: when TLS is configured and the connection
/// failed (rather than the server answering with an error), a handshake of our own tells
/// what the server refused (see `probe`), knowing whether a client certificate was
/// sent (gRPC's own error may carry the server's alert, which does not say that).
pub(crate) async fn explain_tls(
    error: Error,
    config: &EtcdConfig,
    endpoints: &[String],
    bound: Duration,
) -> Error {
    #[cfg(feature = "_tls")]
    if let (Some(files), Error::Unavailable { .. } | Error::Backend { .. } | Error::Tls { .. }) =
        (&config.tls, &error)
        && let Ok(pem) = files.load(BACKEND)
    {
        for endpoint in endpoints.iter().filter(|e| e.starts_with("https://")) {
            if let Some(why) = probe::diagnose(endpoint, &pem, bound).await {
                return Error::tls(BACKEND, why);
            }
        }
    }
    #[cfg(not(feature = "_tls"))]
    let _ = (config, endpoints, bound);
    error
}

/// `options` with TLS set up from `files`.
#[cfg(feature = "_tls")]
pub(crate) fn tls_options(options: ConnectOptions, files: &TlsFiles) -> Result<ConnectOptions> {
    use etcd_client::{Certificate, Identity, TlsOptions};
    let pem = files.load(BACKEND)?;
    let mut tls = TlsOptions::new();
    tls = match pem.ca {
        Some(ca) => tls.ca_certificate(Certificate::from_pem(ca)),
        None => tls.with_native_roots(),
    };
    if let Some((cert, key)) = pem.identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Ok(options.with_tls(tls))
}

#[cfg(not(feature = "_tls"))]
pub(crate) fn tls_options(_: ConnectOptions, _: &TlsFiles) -> Result<ConnectOptions> {
    Err(Error::tls(
        BACKEND,
        "etcds:// needs the `tls` feature (of the lease crate, or of lease-etcd)",
    ))
}
