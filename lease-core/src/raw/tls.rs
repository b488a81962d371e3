//! TLS for backends: the files of a connection ([`TlsFiles`], re-exported at the crate
//! root since applications give them), their loaded PEM bytes ([`TlsPem`]), and what a
//! failed handshake means ([`tls_failure`]).
//!
//! The backends read the files here and hand the PEM bytes to their client libraries, so
//! that a missing or unreadable file is reported the same way on every store: an
//! [`Error::Tls`] naming the file, before anything is sent.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::{Error, InvalidInput};
use crate::raw::errors::error_chain_text;
#[cfg(feature = "rustls")]
use crate::raw::errors::find_cause;
use crate::raw::url::{check_url_userinfo, percent_decode_query, redact_url};

/// The TLS files of a connection: a CA bundle to verify the server with, and a client
/// certificate with its key for mutual TLS. Every field is optional: without `ca` the
/// system's trust store is used; without `cert` and `key` no client certificate is sent.
///
/// ```
/// use lease_core::TlsFiles;
/// let tls = TlsFiles::default().with_ca("/etc/ssl/lease/ca.pem");
/// assert!(!tls.is_empty());
/// assert!(TlsFiles::default().is_empty());
/// ```
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct TlsFiles {
    /// PEM file of the certificate authorities that may sign the server's certificate.
    pub ca: Option<PathBuf>,
    /// PEM file of the client certificate (with its chain), for mutual TLS.
    pub cert: Option<PathBuf>,
    /// PEM file of the client certificate's private key.
    pub key: Option<PathBuf>,
}

impl fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Paths only: the files' contents (a private key) are never read into this type.
        f.debug_struct("TlsFiles")
            .field("ca", &self.ca)
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish()
    }
}

/// The PEM contents of [`TlsFiles`], read and checked.
#[derive(Clone, Default)]
pub struct TlsPem {
    /// The CA bundle, if one was given.
    pub ca: Option<Vec<u8>>,
    /// The client certificate and its key, if given.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for TlsPem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsPem")
            .field("ca", &self.ca.as_ref().map(|c| c.len()))
            .field("identity", &self.identity.as_ref().map(|_| "***"))
            .finish()
    }
}

impl TlsFiles {
    /// With `ca` as the CA bundle.
    pub fn with_ca(mut self, ca: impl Into<PathBuf>) -> Self {
        self.ca = Some(ca.into());
        self
    }

    /// With a client certificate and its key (mutual TLS).
    pub fn with_client(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.cert = Some(cert.into());
        self.key = Some(key.into());
        self
    }

    /// No file given.
    pub fn is_empty(&self) -> bool {
        self.ca.is_none() && self.cert.is_none() && self.key.is_none()
    }

    /// `self`, with each file that `self` leaves unset taken from `other`. Two different
    /// paths for the same file are an error (the same file given twice, e.g. in the URL
    /// and in the config, with different values).
    pub fn merged(&self, other: &TlsFiles) -> Result<TlsFiles, InvalidInput> {
        fn one(
            what: &str,
            a: &Option<PathBuf>,
            b: &Option<PathBuf>,
        ) -> Result<Option<PathBuf>, InvalidInput> {
            match (a, b) {
                (Some(a), Some(b)) if a != b => Err(InvalidInput::Other(format!(
                    "the TLS {what} is given twice: {} and {}",
                    a.display(),
                    b.display()
                ))),
                (Some(a), _) => Ok(Some(a.clone())),
                (None, b) => Ok(b.clone()),
            }
        }
        Ok(TlsFiles {
            ca: one("CA file", &self.ca, &other.ca)?,
            cert: one("client certificate", &self.cert, &other.cert)?,
            key: one("client key", &self.key, &other.key)?,
        })
    }

    /// Reads the files and checks that each holds what it should (PEM certificates, a PEM
    /// private key), and that a certificate comes with its key.
    ///
    /// Errors: [`Error::Tls`] naming the file and what is wrong with it (missing,
    /// unreadable, not PEM, no certificate, no private key), or the half of a client
    /// identity that is missing. Not retryable.
    pub fn load(&self, backend: &'static str) -> Result<TlsPem, Error> {
        let tls = |detail: String| Error::Tls { backend, detail };
        let ca = match &self.ca {
            Some(path) => Some(read_pem(path, "CA file", PemKind::Certificate).map_err(tls)?),
            None => None,
        };
        let identity = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => Some((
                read_pem(cert, "client certificate", PemKind::Certificate).map_err(tls)?,
                read_pem(key, "client key", PemKind::PrivateKey).map_err(tls)?,
            )),
            (Some(cert), None) => {
                return Err(tls(format!(
                    "client certificate {} given without its key (--tls-key, LEASE_TLS_KEY)",
                    cert.display()
                )));
            }
            (None, Some(key)) => {
                return Err(tls(format!(
                    "client key {} given without its certificate (--tls-cert, LEASE_TLS_CERT)",
                    key.display()
                )));
            }
            (None, None) => None,
        };
        Ok(TlsPem { ca, identity })
    }

    /// Takes the URL query parameters `tls_ca`, `tls_cert` and `tls_key` out of `url`,
    /// for the stores whose URLs have no TLS parameters of their own (Redis, etcd).
    /// Returns the URL without them, and the files they name (percent-decoded).
    ///
    /// ```
    /// use lease_core::TlsFiles;
    /// let (url, tls) = TlsFiles::take_from_url("rediss://h:6380/0?tls_ca=%2Fca.pem&x=1")?;
    /// assert_eq!(url, "rediss://h:6380/0?x=1");
    /// assert_eq!(tls, TlsFiles::default().with_ca("/ca.pem"));
    /// # Ok::<(), lease_core::InvalidInput>(())
    /// ```
    ///
    /// Errors: [`InvalidInput::MalformedUrl`] (the URL redacted) for a parameter given
    /// twice, empty, or not valid percent-encoded UTF-8, and for a URL that
    /// [`check_url_userinfo`] refuses (a password with unencoded reserved characters).
    pub fn take_from_url(url: &str) -> Result<(String, TlsFiles), InvalidInput> {
        check_url_userinfo(url)?;
        let Some((base, rest)) = url.split_once('?') else {
            return Ok((url.to_owned(), TlsFiles::default()));
        };
        let (query, fragment) = match rest.split_once('#') {
            Some((q, f)) => (q, Some(f)),
            None => (rest, None),
        };
        let malformed =
            |why: String| InvalidInput::MalformedUrl(format!("{}: {why}", redact_url(url)));
        let mut files = TlsFiles::default();
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let slot = match key {
                "tls_ca" => &mut files.ca,
                "tls_cert" => &mut files.cert,
                "tls_key" => &mut files.key,
                _ => {
                    kept.push(pair);
                    continue;
                }
            };
            let path = percent_decode_query(value).map_err(|e| malformed(format!("{key}: {e}")))?;
            if path.is_empty() {
                return Err(malformed(format!("{key} is empty")));
            }
            if slot.replace(PathBuf::from(path)).is_some() {
                return Err(malformed(format!("{key} given twice")));
            }
        }
        let mut out = base.to_owned();
        if !kept.is_empty() {
            out.push('?');
            out.push_str(&kept.join("&"));
        }
        if let Some(f) = fragment {
            out.push('#');
            out.push_str(f);
        }
        Ok((out, files))
    }
}

#[derive(Clone, Copy)]
enum PemKind {
    Certificate,
    PrivateKey,
}

fn read_pem(path: &Path, what: &str, kind: PemKind) -> Result<Vec<u8>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{what} {}: {e}", path.display()))?;
    let text = String::from_utf8_lossy(&bytes);
    if !text.contains("-----BEGIN ") {
        return Err(format!(
            "{what} {}: not a PEM file (no -----BEGIN line)",
            path.display()
        ));
    }
    let ok = match kind {
        PemKind::Certificate => text.contains("-----BEGIN CERTIFICATE-----"),
        PemKind::PrivateKey => text
            .lines()
            .any(|l| l.starts_with("-----BEGIN ") && l.contains("PRIVATE KEY-----")),
    };
    if !ok {
        let wanted = match kind {
            PemKind::Certificate => "no CERTIFICATE block",
            PemKind::PrivateKey => "no PRIVATE KEY block",
        };
        return Err(format!("{what} {}: {wanted}", path.display()));
    }
    Ok(bytes)
}

/// Installs `fallback()` as rustls's process-wide crypto provider if the application has
/// installed none, and logs that it did (`for_what` says which connection needed it).
/// The backends call it only right before a TLS connection that needs the process-wide
/// provider, so that the application's own choice, made at any time before, wins.
///
/// `fallback` gives the provider and its name (`"ring"`, `"aws-lc-rs"`): the backend's
/// TLS feature decides which.
#[cfg(feature = "rustls")]
pub fn ensure_crypto_provider(
    fallback: impl FnOnce() -> (rustls::crypto::CryptoProvider, &'static str),
    for_what: &str,
) {
    if rustls::crypto::CryptoProvider::get_default().is_some() {
        return;
    }
    let (provider, name) = fallback();
    // An error means another thread installed one meanwhile: that one is used.
    if provider.install_default().is_ok() {
        tracing::info!(
            provider = name,
            "installed rustls's process-wide crypto provider for {for_what} (the application \
             had installed none; to use another, install it before connecting)"
        );
    }
}

/// A client configuration from the files of `pem`: the CA file's certificates as the only
/// roots (else `fallback_roots()`, for backends that trust the system's store), the
/// client identity where one is given, and the application's process-wide crypto provider
/// if it installed one, else `provider` (nothing is installed here). `None` when a file
/// does not parse (the connection's own error then stands).
#[cfg(feature = "rustls")]
pub fn client_config(
    pem: &TlsPem,
    provider: impl FnOnce() -> rustls::crypto::CryptoProvider,
    fallback_roots: impl FnOnce() -> Vec<rustls::pki_types::CertificateDer<'static>>,
) -> Option<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    match &pem.ca {
        Some(ca) => {
            for cert in CertificateDer::pem_slice_iter(ca) {
                roots.add(cert.ok()?).ok()?;
            }
        }
        None => {
            for cert in fallback_roots() {
                let _ = roots.add(cert);
            }
        }
    }
    let provider = match rustls::crypto::CryptoProvider::get_default() {
        Some(installed) => installed.clone(),
        None => std::sync::Arc::new(provider()),
    };
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .ok()?
        .with_root_certificates(roots);
    Some(match &pem.identity {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<Vec<_>, _>>()
                .ok()?;
            let key = PrivateKeyDer::from_pem_slice(key).ok()?;
            builder.with_client_auth_cert(chain, key).ok()?
        }
        None => builder.with_no_client_auth(),
    })
}

/// Why a TLS connection to `host:port` fails, as [`tls_failure_for`] words it: a handshake
/// of the caller's own with `config` (the same files the client library was given), then
/// `first_write` where given (a protocol's opening bytes, so that a server that accepted
/// the handshake answers), then one read. In TLS 1.3 a server judges the client's
/// certificate after the client has finished its side of the handshake, so its verdict
/// arrives as an alert on that first read. For client libraries that report such a
/// connection only as closed, or retry it until their timeout. `None` when the probe sees
/// no TLS failure, or does not finish within `bound` (a server that waits for the client
/// to speak first, having accepted it, also ends here).
#[cfg(feature = "rustls")]
pub async fn probe_handshake(
    host: &str,
    port: u16,
    config: rustls::ClientConfig,
    first_write: Option<&[u8]>,
    bound: std::time::Duration,
) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let sent = config.client_auth_cert_resolver.has_certs();
    let server_name = rustls::pki_types::ServerName::try_from(host.clone()).ok()?;
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let probe = async move {
        let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .ok()?;
        let mut stream = match connector.connect(server_name, tcp).await {
            Ok(stream) => stream,
            Err(e) => return tls_failure_for(&e, Some(sent)),
        };
        if let Some(bytes) = first_write
            && let Err(e) = stream.write_all(bytes).await
        {
            return tls_failure_for(&e, Some(sent));
        }
        let mut byte = [0u8; 1];
        match stream.read(&mut byte).await {
            Err(e) => tls_failure_for(&e, Some(sent)),
            Ok(_) => None,
        }
    };
    tokio::time::timeout(bound, probe).await.ok().flatten()
}

/// Whether `error` is a failed TLS handshake (as rustls, which every backend uses,
/// reports it), and if so what to check, followed by the library's own words. `None` for
/// any other error.
///
/// ```
/// let io = std::io::Error::new(
///     std::io::ErrorKind::InvalidData,
///     "invalid peer certificate: UnknownIssuer",
/// );
/// let why = lease_core::raw::tls::tls_failure(&io).unwrap();
/// assert!(why.starts_with("the server's certificate is not signed by a CA you trust"));
/// ```
pub fn tls_failure(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    tls_failure_for(error, None)
}

/// [`tls_failure`], for a caller that knows whether it presented a client certificate:
/// servers answer a missing certificate and one they do not trust with the same alerts
/// (`BadCertificate` from TLS 1.2 and older servers, `CertificateRequired` from newer
/// ones), so what was sent decides which of the two the message says.
pub fn tls_failure_for(
    error: &(dyn std::error::Error + 'static),
    client_cert_sent: Option<bool>,
) -> Option<String> {
    let text = error_chain_text(error);
    #[cfg(feature = "rustls")]
    let typed = find_cause::<rustls::Error>(error).and_then(Failure::of_rustls);
    #[cfg(not(feature = "rustls"))]
    let typed: Option<Failure> = None;
    let failure = typed.or_else(|| Failure::of_text(&text))?;
    Some(format!("{} ({text})", failure.advice(client_cert_sent)))
}

/// What a failed handshake means, from rustls's error where it is in the chain (the
/// `rustls` feature, which every backend's TLS feature enables), else from its text
/// (client libraries that keep only the message, as gRPC's status does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Failure {
    UnknownIssuer,
    WrongName,
    Expired,
    ServerCertificate,
    /// The server refused the client's certificate or its absence; `true` when the
    /// failure itself says that none was sent.
    ClientCertificate {
        none_sent: bool,
    },
    Ended,
    NotTls,
}

impl Failure {
    #[cfg(feature = "rustls")]
    fn of_rustls(error: &rustls::Error) -> Option<Failure> {
        use rustls::{AlertDescription as A, CertificateError as C};
        Some(match error {
            rustls::Error::InvalidCertificate(c) => match c {
                C::UnknownIssuer => Failure::UnknownIssuer,
                C::NotValidForName | C::NotValidForNameContext { .. } => Failure::WrongName,
                C::Expired
                | C::ExpiredContext { .. }
                | C::NotValidYet
                | C::NotValidYetContext { .. } => Failure::Expired,
                _ => Failure::ServerCertificate,
            },
            rustls::Error::NoCertificatesPresented => {
                Failure::ClientCertificate { none_sent: true }
            }
            rustls::Error::AlertReceived(alert) => match alert {
                A::CertificateRequired => Failure::ClientCertificate { none_sent: true },
                A::BadCertificate
                | A::UnknownCA
                | A::DecryptError
                | A::AccessDenied
                | A::HandshakeFailure => Failure::ClientCertificate { none_sent: false },
                _ => Failure::Ended,
            },
            rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
                Failure::NotTls
            }
            _ => return None,
        })
    }

    fn of_text(text: &str) -> Option<Failure> {
        let has = |s: &str| text.contains(s);
        let refusal = [
            "received fatal alert: CertificateRequired",
            "received fatal alert: BadCertificate",
            "received fatal alert: UnknownCA",
            "received fatal alert: DecryptError",
            "received fatal alert: AccessDenied",
            "received fatal alert: HandshakeFailure",
            "peer sent no certificates",
        ]
        .iter()
        .any(|a| has(a));
        Some(if has("invalid peer certificate") {
            if has("UnknownIssuer") {
                Failure::UnknownIssuer
            } else if has("NotValidForName") || has("not valid for name") {
                Failure::WrongName
            } else if has("Expired") || has("expired") || has("NotValidYet") {
                Failure::Expired
            } else {
                Failure::ServerCertificate
            }
        } else if refusal {
            Failure::ClientCertificate {
                none_sent: has("CertificateRequired") || has("peer sent no certificates"),
            }
        } else if has("received fatal alert") {
            Failure::Ended
        } else if has("InvalidContentType") || has("corrupt message") {
            Failure::NotTls
        } else {
            return None;
        })
    }

    fn advice(self, client_cert_sent: Option<bool>) -> &'static str {
        const REQUIRED: &str = "the server requires a client certificate: give one with its \
             key (--tls-cert and --tls-key, LEASE_TLS_CERT and LEASE_TLS_KEY, tls_cert= and \
             tls_key=, or sslcert= and sslkey=)";
        const REFUSED: &str = "the server refused the client certificate (is it signed by a \
             CA the server trusts?)";
        match self {
            Failure::UnknownIssuer => {
                "the server's certificate is not signed by a CA you trust: give the CA file \
                 that signed it (--tls-ca, LEASE_TLS_CA, tls_ca=, sslrootcert= or ssl-ca=)"
            }
            Failure::WrongName => {
                "the server's certificate is not valid for the host name you connect to \
                 (connect by a name or address the certificate lists)"
            }
            Failure::Expired => {
                "the server's certificate has expired (or is not valid yet): check it and the \
                 clocks"
            }
            Failure::ServerCertificate => "the server's certificate failed verification",
            // Servers answer a missing certificate and one they do not trust with the
            // same alerts: what was sent decides, where the caller knows it.
            Failure::ClientCertificate { none_sent } => match client_cert_sent {
                Some(false) => REQUIRED,
                Some(true) => REFUSED,
                None if none_sent => REQUIRED,
                None => REFUSED,
            },
            Failure::Ended => "the server ended the TLS handshake",
            Failure::NotTls => "the server did not answer in TLS: is TLS enabled on that port?",
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn tls_parameters_come_out_of_the_url() {
        let (url, tls) =
            TlsFiles::take_from_url("rediss://u:pw@h/0?tls_cert=c.pem&tls_key=k%20x.pem#f")
                .unwrap();
        assert_eq!(url, "rediss://u:pw@h/0#f");
        assert_eq!(tls.cert.as_deref(), Some(Path::new("c.pem")));
        assert_eq!(tls.key.as_deref(), Some(Path::new("k x.pem")));
        let e = TlsFiles::take_from_url("rediss://u:pw@h/0?tls_ca=a&tls_ca=b").unwrap_err();
        assert!(e.to_string().contains("given twice"), "{e}");
        assert!(!e.to_string().contains("pw@"), "{e}");
        assert!(TlsFiles::take_from_url("etcds://h?tls_ca=").is_err());
    }

    #[test]
    fn merging_refuses_two_different_files() {
        let a = TlsFiles::default().with_ca("a.pem");
        let b = TlsFiles::default().with_client("c.pem", "k.pem");
        let m = a.merged(&b).unwrap();
        assert_eq!(m.ca.as_deref(), Some(Path::new("a.pem")));
        assert_eq!(m.key.as_deref(), Some(Path::new("k.pem")));
        assert!(a.merged(&a).is_ok());
        let e = a.merged(&TlsFiles::default().with_ca("b.pem")).unwrap_err();
        assert!(e.to_string().contains("a.pem and b.pem"), "{e}");
    }

    #[test]
    fn loading_names_the_file_and_what_is_wrong() {
        let dir = std::env::temp_dir().join(format!("lease-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cert = dir.join("cert.pem");
        let key = dir.join("key.pem");
        let junk = dir.join("junk.txt");
        std::fs::write(
            &cert,
            "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        std::fs::write(
            &key,
            "-----BEGIN PRIVATE KEY-----\nAA==\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        std::fs::write(&junk, "hello").unwrap();
        let ok = TlsFiles::default()
            .with_ca(&cert)
            .with_client(&cert, &key)
            .load("test")
            .unwrap();
        assert!(ok.ca.is_some() && ok.identity.is_some());
        let cases: [(TlsFiles, &str); 5] = [
            (
                TlsFiles::default().with_ca(dir.join("missing.pem")),
                "missing.pem",
            ),
            (TlsFiles::default().with_ca(&junk), "not a PEM file"),
            (TlsFiles::default().with_ca(&key), "no CERTIFICATE block"),
            (
                TlsFiles::default().with_client(&cert, &cert),
                "no PRIVATE KEY block",
            ),
            (
                TlsFiles {
                    cert: Some(cert.clone()),
                    ..TlsFiles::default()
                },
                "without its key",
            ),
        ];
        for (files, want) in cases {
            let e = files.load("test").unwrap_err();
            assert!(matches!(e, Error::Tls { .. }), "{e:?}");
            assert!(!e.is_retryable());
            assert!(e.to_string().contains(want), "{e}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// With rustls's error in the chain, the failure is read from its type: a wrapper
    /// whose own words say nothing TLS-like still gives the right advice.
    #[cfg(feature = "rustls")]
    #[test]
    fn rustls_errors_are_classified_by_type() {
        use rustls::{AlertDescription, CertificateError};
        let cases = [
            (
                rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
                "not signed by a CA you trust",
            ),
            (
                rustls::Error::InvalidCertificate(CertificateError::NotValidYet),
                "has expired (or is not valid yet)",
            ),
            (
                rustls::Error::AlertReceived(AlertDescription::CertificateRequired),
                "requires a client certificate",
            ),
            (
                rustls::Error::AlertReceived(AlertDescription::UnknownCA),
                "refused the client certificate",
            ),
            (
                rustls::Error::AlertReceived(AlertDescription::CloseNotify),
                "ended the TLS handshake",
            ),
        ];
        for (error, want) in cases {
            let io = std::io::Error::other(error.clone());
            let why = tls_failure(&io).unwrap_or_else(|| panic!("{error:?} not classified"));
            assert!(why.contains(want), "{error:?}: {why}");
        }
        assert_eq!(
            Failure::of_rustls(&rustls::Error::InvalidCertificate(
                CertificateError::NotValidYet
            )),
            Some(Failure::Expired)
        );
        // Text alone would not see a not-yet-valid certificate as a date problem in
        // older wording; the type does.
        assert_eq!(Failure::of_text("handshake failed"), None);
    }
}
