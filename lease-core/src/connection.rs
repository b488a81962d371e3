//! What every backend needs to open a connection: TLS files (a CA bundle, a client
//! certificate and key), store URLs with their secrets hidden, and a look into an error's
//! causes.
//!
//! The backends read the files here and hand the PEM bytes to their client libraries, so
//! that a missing or unreadable file is reported the same way on every store: an
//! [`Error::Tls`] naming the file, before anything is sent.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::{Error, InvalidInput};

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
            let path = percent_decode(value).map_err(|e| malformed(format!("{key}: {e}")))?;
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

/// Decodes a URL query value: `%XX` escapes, and `+` as a space. For the backends that
/// read parameters of their own out of a store URL.
///
/// ```
/// assert_eq!(lease_core::percent_decode("%2Fetc%2Fca.pem").as_deref(), Ok("/etc/ca.pem"));
/// assert!(lease_core::percent_decode("%zz").is_err());
/// ```
///
/// Errors: a `%` not followed by two hexadecimal digits, or bytes that are not UTF-8
/// once decoded.
pub fn percent_decode(s: &str) -> Result<String, &'static str> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let byte = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or("bad percent-encoding")?;
                out.push(byte);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| "percent-encoding is not UTF-8")
}

/// The password of `url`'s userinfo as written (still percent-encoded), if there is one
/// and it is not empty.
///
/// The password is taken to run from the first `:` after `scheme://` to the *last* `@` of
/// the URL, so that a password with unencoded reserved characters (`/`, `?`, `#`, `@`,
/// `:`) is found whole. For a URL that [`check_url_userinfo`] accepts this is exactly the
/// password; for one it refuses (an `@` in the path or query) it may be more than the
/// password, never less.
///
/// ```
/// use lease_core::url_password;
/// assert_eq!(url_password("redis://app:s3cret@h:6379/0"), Some("s3cret"));
/// assert_eq!(url_password("etcd://u:ab/c#d@h1,h2"), Some("ab/c#d"));
/// assert_eq!(url_password("postgres://u@h/db"), None);
/// ```
pub fn url_password(url: &str) -> Option<&str> {
    password_range(url).map(|(from, to)| &url[from..to])
}

/// The byte range of [`url_password`] in `url`.
fn password_range(url: &str) -> Option<(usize, usize)> {
    let start = url.find("://")? + 3;
    let rest = &url[start..];
    let at = rest.rfind('@')?;
    let colon = rest[..at].find(':')?;
    (colon + 1 < at).then_some((start + colon + 1, start + at))
}

/// Query parameters whose values are secrets, redacted by [`redact_url`].
const SECRET_PARAMS: [&str; 4] = ["pass", "password", "sslpassword", "token"];

/// `url` with its password (in the userinfo, or in a `password`, `pass`, `sslpassword` or
/// `token` query parameter) replaced by `***`, for messages and logs. The user name stays.
/// Works on any `scheme://` URL, including ones that do not parse (a secret in a malformed
/// URL is still hidden); text that is not a URL is not shown at all.
///
/// Unencoded reserved characters in a password (`/`, `?`, `#`, `@`, `:`; a base64
/// password has `/`) are hidden too: everything from the first `:` after `scheme://` to the
/// last `@` is hidden (see [`url_password`]), and a secret query parameter's value runs to
/// the next `&` (a `#` in it included). The rule errs toward hiding more: in a URL with an
/// `@` in its path or query (which [`check_url_userinfo`] refuses) more than the password
/// may be hidden, never less.
///
/// ```
/// use lease_core::redact_url;
/// assert_eq!(redact_url("redis://app:s3cret@h:6379/0"), "redis://app:***@h:6379/0");
/// assert_eq!(redact_url("redis://:ab/cd@h:6379"), "redis://:***@h:6379");
/// assert_eq!(redact_url("postgres://h/db?password=s3cret&sslmode=require"),
///            "postgres://h/db?password=***&sslmode=require");
/// assert_eq!(redact_url("etcd://h1:2379,h2/app"), "etcd://h1:2379,h2/app");
/// assert_eq!(redact_url("app:s3cret@h"), "(not a URL)");
/// ```
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return "(not a URL)".to_owned();
    };
    let start = scheme_end + 3;
    let rest = &url[start..];
    // Byte ranges of `url` to hide.
    let mut hidden: Vec<(usize, usize)> = password_range(url).into_iter().collect();
    for (i, c) in rest.char_indices() {
        if c != '?' && c != '&' {
            continue;
        }
        let Some((key, value)) = rest[i + 1..].split_once('=') else {
            continue;
        };
        if SECRET_PARAMS.contains(&key.to_ascii_lowercase().as_str()) {
            let from = start + i + 1 + key.len() + 1;
            let len = value.find('&').unwrap_or(value.len());
            if len > 0 {
                hidden.push((from, from + len));
            }
        }
    }
    hidden.sort_unstable();
    let mut merged: Vec<(usize, usize)> = Vec::with_capacity(hidden.len());
    for (from, to) in hidden {
        match merged.last_mut() {
            Some(last) if from <= last.1 => last.1 = last.1.max(to),
            _ => merged.push((from, to)),
        }
    }
    let mut out = String::with_capacity(url.len());
    let mut shown_to = 0;
    for (from, to) in merged {
        out.push_str(&url[shown_to..from]);
        out.push_str("***");
        shown_to = to;
    }
    out.push_str(&url[shown_to..]);
    out
}

/// Refuses a URL whose user name and password cannot be told apart from the rest: one
/// with an `@` after the first `/`, `?` or `#` that follows `scheme://`. Such a URL is
/// either a password (or user name) with unencoded reserved characters, which every
/// client library would cut at the `/`, `?` or `#` (connecting with a wrong password, or
/// showing part of it as a host, port or path), or an `@` in the path or query, which must
/// then be written `%40`. Every backend checks its URL with this before parsing it.
///
/// ```
/// use lease_core::check_url_userinfo;
/// assert!(check_url_userinfo("redis://u:p%2Fw@h:6379/0").is_ok());
/// assert!(check_url_userinfo("etcd://u:p@w@h1,h2/app").is_ok());
/// let e = check_url_userinfo("redis://u:p/w@h:6379/0").unwrap_err();
/// assert!(e.to_string().contains("percent-encode"));
/// assert!(!e.to_string().contains("p/w"));
/// ```
///
/// Errors: [`InvalidInput::MalformedUrl`], with the URL redacted (by [`redact_url`]) and
/// saying which characters to percent-encode.
pub fn check_url_userinfo(url: &str) -> Result<(), InvalidInput> {
    let Some((_, rest)) = url.split_once("://") else {
        return Ok(());
    };
    let Some(last_at) = rest.rfind('@') else {
        return Ok(());
    };
    match rest.find(['/', '?', '#']) {
        Some(authority_end) if authority_end < last_at => Err(InvalidInput::MalformedUrl(format!(
            "{}: an '@' follows a '/', '?' or '#', so where the password ends is unclear: \
                 percent-encode the reserved characters of the user name and password ('/' \
                 as %2F, '?' as %3F, '#' as %23, '@' as %40, ':' as %3A), and an '@' in the \
                 path or query as %40",
            redact_url(url)
        ))),
        _ => Ok(()),
    }
}

/// The first error of type `T` among `error` and its causes. Also looks inside
/// [`std::io::Error`]s, whose `source` skips the error they wrap (TLS libraries report
/// through them).
pub fn find_cause<'a, T: std::error::Error + 'static>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a T> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(t) = e.downcast_ref::<T>() {
            return Some(t);
        }
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            && let Some(t) = find_cause::<T>(inner)
        {
            return Some(t);
        }
        next = e.source();
    }
    None
}

/// The messages of `error` and its causes (also inside [`std::io::Error`]s), joined by
/// `": "`, each one only once.
pub fn error_chain_text(error: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut push = |text: String| {
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
    };
    let mut next = Some(error);
    while let Some(e) = next {
        push(e.to_string());
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            push(error_chain_text(inner));
        }
        next = e.source();
    }
    parts.join(": ")
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
/// let why = lease_core::tls_failure(&io).unwrap();
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
    const REQUIRED: &str = "the server requires a client certificate: give one with its key \
         (--tls-cert and --tls-key, LEASE_TLS_CERT and LEASE_TLS_KEY, tls_cert= and \
         tls_key=, or sslcert= and sslkey=)";
    const REFUSED: &str =
        "the server refused the client certificate (is it signed by a CA the server trusts?)";
    let text = error_chain_text(error);
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
    let why = if has("invalid peer certificate") {
        if has("UnknownIssuer") {
            "the server's certificate is not signed by a CA you trust: give the CA file that \
             signed it (--tls-ca, LEASE_TLS_CA, tls_ca=, sslrootcert= or ssl-ca=)"
        } else if has("NotValidForName") || has("not valid for name") {
            "the server's certificate is not valid for the host name you connect to (connect \
             by a name or address the certificate lists)"
        } else if has("Expired") || has("expired") {
            "the server's certificate has expired (or is not valid yet): check it and the \
             clocks"
        } else {
            "the server's certificate failed verification"
        }
    } else if refusal {
        match client_cert_sent {
            Some(false) => REQUIRED,
            Some(true) => REFUSED,
            None if has("CertificateRequired") || has("peer sent no certificates") => REQUIRED,
            None => REFUSED,
        }
    } else if has("received fatal alert") {
        "the server ended the TLS handshake"
    } else if has("InvalidContentType") || has("corrupt message") {
        "the server did not answer in TLS: is TLS enabled on that port?"
    } else {
        return None;
    };
    Some(format!("{why} ({text})"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn redaction_hides_every_password() {
        for (url, want) in [
            ("redis://u:pw@h:1/0", "redis://u:***@h:1/0"),
            ("redis://:pw@h", "redis://:***@h"),
            ("rediss://u@h", "rediss://u@h"),
            ("etcd://u:p@w@h1,h2/x", "etcd://u:***@h1,h2/x"),
            ("postgres://u:pw@[::1/db", "postgres://u:***@[::1/db"),
            (
                "redis+unix:///s.sock?db=1&pass=pw",
                "redis+unix:///s.sock?db=1&pass=***",
            ),
            // A secret parameter's value runs to the next '&' ('#' included).
            (
                "postgres://h/d?PASSWORD=pw#f",
                "postgres://h/d?PASSWORD=***",
            ),
            (
                "postgres://h/d?a=1&token=pw&b=2",
                "postgres://h/d?a=1&token=***&b=2",
            ),
            // An '@' in the path may end a password with a '/': hidden (over-redacted).
            ("etcd://h:1/p@x", "etcd://h:***@x"),
            ("etcd://h:1/prefix", "etcd://h:1/prefix"),
            ("redis://u:p?pass=pw@h", "redis://u:***"),
            (
                "mysql://u:pw@h/db?password=pw",
                "mysql://u:***@h/db?password=***",
            ),
            ("nothing", "(not a URL)"),
        ] {
            assert_eq!(redact_url(url), want, "{url}");
            assert!(!redact_url(url).contains("pw"), "{url}");
        }
    }

    /// Whether `shown` contains `secret`, or any 4 characters in a row of it.
    fn shows_part_of(shown: &str, secret: &str) -> bool {
        let chars: Vec<char> = secret.chars().collect();
        chars
            .windows(4.min(chars.len()))
            .any(|w| shown.contains(&w.iter().collect::<String>()))
    }

    /// Passwords with unencoded reserved characters (issue 31, finding 4): a base64
    /// password has '/', and '?', '#', '@' and ':' are common in generated ones.
    #[test]
    fn redaction_hides_passwords_with_reserved_characters() {
        let leaks = [
            ("redis://:ab/cd@h:6379", "ab/cd"),
            ("etcd://u:se#cret@h", "se#cret"),
            ("postgres://u:p?wd@h/db", "p?wd"),
            ("mysql://u:a/b?c#d@h:3306/db", "a/b?c#d"),
            ("rediss+cluster://u:x/y@z@h1:1,h2:2", "x/y@z"),
            ("etcd://u:K1/+9w==@h1:2379,h2:2379/app", "K1/+9w=="),
            ("redis+unix:///s.sock?db=1&pass=se#cret", "se#cret"),
        ]
        .into_iter()
        .filter_map(|(url, secret)| {
            let shown = redact_url(url);
            shows_part_of(&shown, secret).then(|| format!("{url} shown as {shown}"))
        })
        .collect::<Vec<_>>();
        assert!(leaks.is_empty(), "{leaks:#?}");
    }

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

    #[test]
    fn causes_are_found_inside_io_errors() {
        #[derive(Debug)]
        struct Inner;
        impl fmt::Display for Inner {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("inner")
            }
        }
        impl std::error::Error for Inner {}
        let io = std::io::Error::other(Inner);
        assert!(find_cause::<Inner>(&io).is_some());
        let plain = std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        assert!(find_cause::<Inner>(&plain).is_none());
    }
}
