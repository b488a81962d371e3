//! TLS to Redis: the client for a `rediss://` URL with the files of a [`TlsFiles`], the
//! crypto provider, and the check that tells a plain-text port from a silent TLS one.

use super::*;

/// The client for `url`, with `tls`'s files for a `rediss://` URL.
pub(crate) fn tls_client(url: &str, tls: &TlsFiles) -> Result<Client> {
    let secure = url
        .get(..9)
        .is_some_and(|s| s.eq_ignore_ascii_case("rediss://"));
    if secure && !cfg!(feature = "_tls") {
        return Err(Error::tls(
            BACKEND,
            "rediss:// needs the `tls` feature (of the lease crate, or of lease-redis)",
        ));
    }
    if tls.is_empty() {
        return Client::open(url).map_err(|e| error::malformed_url(url, &e));
    }
    if !secure {
        return Err(InvalidInput::MalformedUrl(format!(
            "{}: TLS files are given, but the URL is not rediss://",
            error::redact_url(url)
        ))
        .into());
    }
    match tls_certificates(tls)? {
        #[cfg(feature = "_tls")]
        Some(certs) => Client::build_with_tls(url, certs).map_err(|e| {
            // The files were read; the client library could not use them.
            let text = lease_core::raw::errors::error_chain_text(&e);
            Error::tls(
                BACKEND,
                format!("the TLS files {tls:?} could not be used: {text}"),
            )
        }),
        #[cfg(not(feature = "_tls"))]
        Some(certs) => match certs {},
        None => Client::open(url).map_err(|e| error::malformed_url(url, &e)),
    }
}

/// Before a TLS connection: the redis client builds its TLS settings from rustls's
/// process-wide crypto provider (and rustls panics where it cannot pick one). If the
/// application installed a provider, it is used and nothing changes. Otherwise the one
/// this crate was built with is installed (ring with `tls` or `tls-ring`, aws-lc-rs with
/// `tls-aws-lc-rs`, ring when both are), and that is logged: rustls keeps one provider
/// per process, so an application that wants another installs it before its first TLS
/// connection to Redis. Without a TLS feature, nothing.
pub(crate) fn ensure_crypto_provider() {
    #[cfg(feature = "tls-ring")]
    lease_core::raw::tls::ensure_crypto_provider(
        || (rustls::crypto::ring::default_provider(), "ring"),
        "TLS to Redis",
    );
    #[cfg(all(feature = "tls-aws-lc-rs", not(feature = "tls-ring")))]
    lease_core::raw::tls::ensure_crypto_provider(
        || (rustls::crypto::aws_lc_rs::default_provider(), "aws-lc-rs"),
        "TLS to Redis",
    );
}

/// The certificates `tls`'s files give, read now (`None` without files). Installs a
/// crypto provider for rustls if the application installed none (see
/// [`ensure_crypto_provider`]).
pub(crate) fn tls_certificates(tls: &TlsFiles) -> Result<Option<cluster::Certs>> {
    if tls.is_empty() {
        return Ok(None);
    }
    #[cfg(feature = "_tls")]
    {
        ensure_crypto_provider();
        let pem = tls.load(BACKEND)?;
        Ok(Some(redis::TlsCertificates {
            client_tls: pem
                .identity
                .map(|(client_cert, client_key)| redis::ClientTlsConfig {
                    client_cert,
                    client_key,
                }),
            root_cert: pem.ca,
        }))
    }
    #[cfg(not(feature = "_tls"))]
    {
        Err(Error::tls(
            BACKEND,
            "TLS files need the `tls` feature (of the lease crate, or of lease-redis)",
        ))
    }
}

/// For a `rediss://` connection that got no answer: whether the port speaks plain RESP
/// instead of TLS. redis-server reads a TLS hello on its plain port as the start of an
/// inline command and waits for the rest of the line, so the TLS connect just times out;
/// a plain `PING` on the same port answers at once.
pub(crate) async fn plain_port(client: &Client, bound: Duration) -> Option<Error> {
    let redis::ConnectionAddr::TcpTls { host, port, .. } = client.get_connection_info().addr()
    else {
        return None;
    };
    let probe = async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tcp = tokio::net::TcpStream::connect((host.as_str(), *port))
            .await
            .ok()?;
        tcp.write_all(b"PING\r\n").await.ok()?;
        let mut reply = [0u8; 16];
        let n = tcp.read(&mut reply).await.ok()?;
        let reply = reply.get(..n)?;
        (reply.starts_with(b"+PONG") || reply.starts_with(b"-NOAUTH")).then(|| {
            Error::tls(
                BACKEND,
                format!(
                    "the server did not answer in TLS: port {port} speaks plain text (use \
                     redis:// there, or the server's tls-port with rediss://)"
                ),
            )
        })
    };
    tokio::time::timeout(bound, probe).await.ok().flatten()
}
