//! Store URLs: percent-decoding (one strict implementation for every backend), the
//! password of a URL, the URL with its secrets hidden, and the check that refuses a URL
//! whose password cannot be found for certain.

use crate::error::InvalidInput;

/// Decodes `%XX` escapes, strictly: a `%` must be followed by two hexadecimal digits,
/// and the decoded bytes must be UTF-8. `+` stays `+` (as RFC 3986 says for every part
/// of a URL: a password such as `K1/+9w==` keeps its `+`). For user names, passwords,
/// paths and key prefixes in store URLs; query values use [`percent_decode_query`].
///
/// ```
/// use lease_core::raw::url::percent_decode;
/// assert_eq!(percent_decode("p%40ss+w").as_deref(), Ok("p@ss+w"));
/// assert!(percent_decode("%zz").is_err());
/// assert!(percent_decode("50%").is_err());
/// ```
///
/// Errors: a `%` not followed by two hexadecimal digits, or bytes that are not UTF-8
/// once decoded.
pub fn percent_decode(s: &str) -> Result<String, &'static str> {
    decode(s, false)
}

/// [`percent_decode`] for a query value of a store URL (`?tls_ca=...`): the same, and
/// `+` is a space (as HTML forms and most URL libraries write query values).
///
/// ```
/// use lease_core::raw::url::percent_decode_query;
/// assert_eq!(percent_decode_query("%2Fetc%2Fca+1.pem").as_deref(), Ok("/etc/ca 1.pem"));
/// assert!(percent_decode_query("%zz").is_err());
/// ```
///
/// Errors: as [`percent_decode`].
pub fn percent_decode_query(s: &str) -> Result<String, &'static str> {
    decode(s, true)
}

fn decode(s: &str, plus_is_space: bool) -> Result<String, &'static str> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let byte = bytes
                    .get(i + 1..i + 3)
                    .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or("bad percent-encoding (write a literal % as %25)")?;
                out.push(byte);
                i += 3;
            }
            b'+' if plus_is_space => {
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
/// use lease_core::raw::url::url_password;
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
/// use lease_core::raw::url::redact_url;
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
/// use lease_core::raw::url::check_url_userinfo;
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
}
