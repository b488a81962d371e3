//! Property tests: a password is never shown by [`redact_url`], nor by the errors of
//! [`check_url_userinfo`] and [`TlsFiles::take_from_url`], whatever reserved characters
//! (`/ ? # @ : %`) it has unencoded, on every URL scheme the stores accept; and a URL
//! that `check_url_userinfo` accepts has exactly its password found by [`url_password`].
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use lease_core::TlsFiles;
use lease_core::raw::url::{check_url_userinfo, redact_url, url_password};
use proptest::prelude::*;

/// Every scheme `leasehold::connect` and the backends accept (with a password).
const SCHEMES: [&str; 13] = [
    "redis",
    "rediss",
    "valkey",
    "valkeys",
    "redis+sentinel",
    "redis+cluster",
    "rediss+cluster",
    "postgres",
    "postgresql",
    "mysql",
    "mariadb",
    "etcd",
    "etcds",
];

/// Host lists: one host, several (etcd, sentinel, cluster), IPv6.
const HOSTS: [&str; 5] = [
    "h",
    "db.example:6379",
    "127.0.0.1:2379,127.0.0.1:2380,10.0.0.3",
    "[::1]:5432",
    "node-1:7000,node-2:7001",
];

/// What follows the hosts: database, sentinel service, etcd prefix, query parameters.
const TAILS: [&str; 8] = [
    "",
    "/",
    "/0",
    "/mymaster/2",
    "/team/app",
    "/db?sslmode=require",
    "?tls_ca=%2Fetc%2Fca.pem&tls_cert=c.pem&tls_key=k.pem",
    "/db?ssl-mode=REQUIRED&table=leases",
];

/// base64 and the characters a URL reserves, unencoded.
fn password() -> impl Strategy<Value = String> {
    "[A-Za-z0-9+/=?#@:%&,;!$._~-]{4,32}"
}

/// A query-parameter password: as [`password`], without `&` (which ends the value).
fn query_password() -> impl Strategy<Value = String> {
    "[A-Za-z0-9+/=?#@:%,;!$._~-]{4,32}"
}

/// `text` shows part of `secret`: 4 characters of it in a row that are not elsewhere in
/// `url` (the URL with the secret taken out) nor in the library's fixed wording, `fixed`
/// (see [`fixed_wording`]): the hint of an ambiguous URL says "'#' as %23, '@' as %40",
/// which is not a leak of the password "%23,/" (a case proptest found).
fn shows(text: &str, secret: &str, url: &str, fixed: &[String]) -> Option<String> {
    let elsewhere = url.replace(secret, " ");
    let chars: Vec<char> = secret.chars().collect();
    chars
        .windows(4)
        .map(|w| w.iter().collect::<String>())
        .find(|w| {
            !elsewhere.contains(w.as_str())
                && !fixed.iter().any(|f| f.contains(w.as_str()))
                && text.contains(w.as_str())
        })
}

/// What the library prints for `url` with `secret` masked: each of its characters other
/// than the delimiters `/ ? # @ :` replaced by `Q`, so that the same checks fail the same
/// way and the texts hold the same fixed wording, but no 4 characters of the secret that
/// the library could only have taken from it (a masked password shows as `Q`s).
fn fixed_wording(url: &str, secret: &str) -> Vec<String> {
    let masked: String = secret
        .chars()
        .map(|c| if "/?#@:".contains(c) { c } else { 'Q' })
        .collect();
    printed(&url.replace(secret, &masked))
}

/// Everything the library would print about `url`: its redacted form and the errors of
/// the checks every backend runs first.
fn printed(url: &str) -> Vec<String> {
    let mut out = vec![redact_url(url)];
    if let Err(e) = check_url_userinfo(url) {
        out.push(e.to_string());
    }
    match TlsFiles::take_from_url(url) {
        Err(e) => out.push(e.to_string()),
        // The URL handed on is only ever shown redacted.
        Ok((rest, _)) => out.push(redact_url(&rest)),
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn userinfo_passwords_are_never_shown(
        scheme in proptest::sample::select(&SCHEMES[..]),
        user in "[a-z0-9_]{0,8}",
        password in password(),
        hosts in proptest::sample::select(&HOSTS[..]),
        tail in proptest::sample::select(&TAILS[..]),
    ) {
        let url = format!("{scheme}://{user}:{password}@{hosts}{tail}");
        let fixed = fixed_wording(&url, &password);
        for text in printed(&url) {
            let leak = shows(&text, &password, &url, &fixed);
            prop_assert!(leak.is_none(), "{url}: {leak:?} shown in {text}");
        }
        // A URL accepted is one whose password is found exactly; one refused is one
        // whose password has a '/', '?' or '#'.
        let ambiguous = password.contains(['/', '?', '#']);
        prop_assert_eq!(check_url_userinfo(&url).is_err(), ambiguous, "{}", url);
        if !ambiguous {
            prop_assert_eq!(url_password(&url), Some(password.as_str()), "{}", url);
        }
    }

    #[test]
    fn query_passwords_are_never_shown(
        key in proptest::sample::select(&["pass", "password", "PASSWORD", "sslpassword", "token"][..]),
        before in proptest::sample::select(&["redis+unix:///run/redis.sock?db=1&", "postgres://h/db?", "mysql://u@h:3306/db?ssl-mode=REQUIRED&"][..]),
        password in query_password(),
        after in proptest::sample::select(&["", "&sslmode=require", "&x=1#frag"][..]),
    ) {
        let url = format!("{before}{key}={password}{after}");
        let shown = redact_url(&url);
        let leak = shows(&shown, &password, &url, &[]);
        prop_assert!(leak.is_none(), "{url}: {leak:?} shown in {shown}");
    }

    #[test]
    fn passwords_in_both_places_are_never_shown(
        scheme in proptest::sample::select(&SCHEMES[..]),
        first in password(),
        second in query_password(),
    ) {
        let url = format!("{scheme}://u:{first}@h1:1,h2:2/db?password={second}&sslmode=disable");
        let fixed = [fixed_wording(&url, &first), fixed_wording(&url, &second)];
        for text in printed(&url) {
            for (secret, fixed) in [&first, &second].into_iter().zip(&fixed) {
                let leak = shows(&text, secret, &url, fixed);
                prop_assert!(leak.is_none(), "{url}: {leak:?} shown in {text}");
            }
        }
    }
}

#[test]
fn ambiguous_urls_are_refused_with_what_to_do() {
    for url in [
        "redis://:ab/cd@h:6379",
        "etcd://u:se#cret@h",
        "postgres://u:p?w@h/db",
        "etcd://h:1/pre@fix",
        "redis+unix:///s.sock?pass=p@w",
    ] {
        let e = check_url_userinfo(url).unwrap_err();
        let text = e.to_string();
        assert!(
            matches!(e, lease_core::InvalidInput::MalformedUrl(_)),
            "{url}"
        );
        assert!(text.contains("percent-encode"), "{url}: {text}");
        assert!(text.contains("%2F"), "{url}: {text}");
        assert!(TlsFiles::take_from_url(url).is_err(), "{url}");
    }
    for url in [
        "redis://:ab%2Fcd@h:6379",
        "etcd://u:p@w@h1,h2/app",
        "etcd://h:1/pre%40fix",
        "postgres://u:p%3Fw@h/db?sslmode=require",
        "memory://",
        "no scheme",
    ] {
        assert!(check_url_userinfo(url).is_ok(), "{url}");
    }
}
