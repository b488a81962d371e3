//! Parsing `etcd://` URLs.
//!
//! ```text
//! etcd://[user[:password]@]host[:port][,host[:port]...][/prefix]
//! etcds://[user[:password]@]host[:port][,host[:port]...][/prefix][?tls_ca=FILE&tls_cert=FILE&tls_key=FILE]
//! ```
//!
//! `etcds://` connects over TLS (`https://` endpoints).
//! The port defaults to 2379; IPv6 hosts are written in brackets (`[::1]:2379`). User,
//! password and prefix may be percent-encoded (`%40` for `@`); a `/`, `?` or `#` in the
//! user or password, or an `@` in the prefix, must be (such a URL is refused, see
//! [`lease_core::raw::url::check_url_userinfo`]). Error messages never contain the password.

use lease_core::InvalidInput;
use lease_core::raw::url::percent_decode;

use crate::EtcdConfig;

/// Default client port of etcd.
pub(crate) const DEFAULT_PORT: u16 = 2379;

/// The endpoints (`http://host:port`, or `https://` for `etcds://`) and settings a URL
/// describes.
pub(crate) fn parse(url: &str) -> Result<(Vec<String>, EtcdConfig), InvalidInput> {
    parse_onto(url, EtcdConfig::default())
}

/// [`parse`], with `base` for what the URL does not say: the URL's user, password,
/// prefix and TLS files replace `base`'s where it gives them (TLS files are merged: the
/// same file named twice is fine, two different ones are refused).
pub(crate) fn parse_onto(
    url: &str,
    base: EtcdConfig,
) -> Result<(Vec<String>, EtcdConfig), InvalidInput> {
    let malformed = |why: &str| InvalidInput::MalformedUrl(format!("{}: {why}", redact(url)));
    let (stripped, tls_files) = lease_core::TlsFiles::take_from_url(url)?;
    let Some((scheme, rest)) = stripped.split_once("://") else {
        return Err(malformed(
            "expected etcd://[user:password@]host:port[,host:port...][/prefix]",
        ));
    };
    let secure = match scheme.to_ascii_lowercase().as_str() {
        "etcd" => false,
        "etcds" => true,
        _ => return Err(malformed("the scheme must be etcd:// or etcds://")),
    };
    if rest.contains(['?', '#']) {
        return Err(malformed(
            "the only query parameters are tls_ca, tls_cert and tls_key (for etcds://)",
        ));
    }
    if !secure && !tls_files.is_empty() {
        return Err(malformed(
            "TLS files are given, but the URL is not etcds://",
        ));
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, ""),
    };
    if !secure && base.tls.is_some() {
        return Err(malformed(
            "the config gives TLS files, but the URL is not etcds://",
        ));
    }
    let mut config = base;
    let hosts = match authority.rfind('@') {
        Some(at) => {
            let userinfo = &authority[..at];
            let (user, password) = match userinfo.split_once(':') {
                Some((u, p)) => (u, Some(p)),
                None => (userinfo, None),
            };
            let user = percent_decode(user).map_err(|e| malformed(&format!("user: {e}")))?;
            if user.is_empty() {
                return Err(malformed("empty user name before '@'"));
            }
            config.user = Some(user);
            config.password = match password {
                Some(p) => Some(percent_decode(p).map_err(|_| malformed("bad password encoding"))?),
                None => Some(String::new()),
            };
            &authority[at + 1..]
        }
        None => authority,
    };
    let mut endpoints = Vec::new();
    for host in hosts.split(',') {
        let http = endpoint(host).map_err(|e| malformed(&e))?;
        endpoints.push(if secure {
            http.replacen("http://", "https://", 1)
        } else {
            http
        });
    }
    if secure {
        config.tls = Some(match config.tls.take() {
            Some(given) => given.merged(&tls_files)?,
            None => tls_files,
        });
    }
    let path = path.trim_end_matches('/');
    if !path.is_empty() {
        config.key_prefix = percent_decode(path).map_err(|e| malformed(&format!("prefix: {e}")))?;
    }
    Ok((endpoints, config))
}

/// `host[:port]` -> `http://host:port`.
fn endpoint(host: &str) -> Result<String, String> {
    if host.is_empty() {
        return Err("empty host".into());
    }
    let (name, port) = if let Some(rest) = host.strip_prefix('[') {
        let Some((v6, after)) = rest.split_once(']') else {
            return Err(format!("unclosed '[' in {host:?}"));
        };
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| format!("expected ':port' after ']' in {host:?}"))?,
            ),
        };
        (format!("[{v6}]"), port)
    } else {
        match host.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), Some(p)),
            None => (host.to_owned(), None),
        }
    };
    if name.is_empty() || name == "[]" {
        return Err(format!("empty host name in {host:?}"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || matches!(c, '/' | '@' | '%' | '\\'))
    {
        return Err(format!("host {name:?} contains {c:?}"));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => match p.parse::<u16>() {
            Ok(0) | Err(_) => return Err(format!("bad port {p:?}")),
            Ok(p) => p,
        },
    };
    Ok(format!("http://{name}:{port}"))
}

pub(crate) use lease_core::redact_url as redact;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn single_host_defaults() {
        let (eps, c) = parse("etcd://127.0.0.1:2379").unwrap();
        assert_eq!(eps, vec!["http://127.0.0.1:2379"]);
        assert_eq!(c.key_prefix, "lease");
        assert_eq!(c.user, None);
        let (eps, _) = parse("etcd://db.example").unwrap();
        assert_eq!(eps, vec!["http://db.example:2379"]);
    }

    #[test]
    fn several_hosts_prefix_and_user() {
        let (eps, c) = parse("ETCD://u:p%40ss@h1:1,h2,[::1]:3/team/app/").unwrap();
        assert_eq!(eps, vec!["http://h1:1", "http://h2:2379", "http://[::1]:3"]);
        assert_eq!(c.key_prefix, "team/app");
        assert_eq!(c.user.as_deref(), Some("u"));
        assert_eq!(c.password.as_deref(), Some("p@ss"));
    }

    #[test]
    fn errors_never_show_the_password() {
        for bad in [
            "etcd://u:secret@h:99999",
            "etcd://u:secret@",
            "etcd://u:secret@h:1,,h2",
            "etcds://u:secret@h:1?x=1",
            "etcd://u:secret@h:1?tls_ca=a.pem",
            "etcd://u:secret@h:1?x=1",
            "redis://u:secret@h:1",
            "etcd://u:secret@h:1/%zz",
            // Issue 31, finding 4: unencoded '/', '?', '#' in the password. Cut at the
            // '/', the first was "bad port \"secret\"".
            "etcd://u:secret/x@h1:2379,h2:2379/app",
            "etcds://u:secret?x@h:1",
            "etcd://u:secret#x@h",
        ] {
            let e = parse(bad).unwrap_err();
            assert!(matches!(e, InvalidInput::MalformedUrl(_)), "{bad}: {e:?}");
            assert!(!e.to_string().contains("secret"), "{bad}: {e}");
        }
        assert!(parse("u:secret@h:1").is_err());
        assert!(!redact("u:secret@h:1").contains("secret"));
    }

    #[test]
    fn etcds_gives_https_endpoints_and_files() {
        let (eps, c) = parse("etcds://h1:1,h2/p?tls_ca=%2Fca.pem&tls_cert=c&tls_key=k").unwrap();
        assert_eq!(eps, vec!["https://h1:1", "https://h2:2379"]);
        assert_eq!(c.key_prefix, "p");
        let tls = c.tls.unwrap();
        assert_eq!(tls.ca.as_deref(), Some(std::path::Path::new("/ca.pem")));
        assert_eq!(tls.key.as_deref(), Some(std::path::Path::new("k")));
        let (_, c) = parse("etcds://h").unwrap();
        assert_eq!(c.tls, Some(lease_core::TlsFiles::default()));
    }

    #[test]
    fn redaction() {
        assert_eq!(redact("etcd://u:pw@h:1/p"), "etcd://u:***@h:1/p");
        // An '@' after the path's '/' may end a password with a '/': hidden.
        assert_eq!(redact("etcd://h:1/p@x"), "etcd://h:***@x");
    }
}
