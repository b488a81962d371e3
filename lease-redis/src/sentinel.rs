//! `redis+sentinel://` URLs: the sentinels to ask, the service (the name the sentinels
//! monitor the primary under), and the credentials and database of the Redis servers.

use lease_core::{Error, InvalidInput, Result};
use redis::RedisConnectionInfo;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};

use crate::error::convert;

const SCHEME: &str = "redis+sentinel://";
const DEFAULT_PORT: u16 = 26379;

/// Whether `url` asks for Redis Sentinel.
pub(crate) fn is_sentinel_url(url: &str) -> bool {
    url.get(..SCHEME.len())
        .is_some_and(|s| s.eq_ignore_ascii_case(SCHEME))
}

/// A parsed `redis+sentinel://[user][:password@]host[:port][,host[:port]...]/service[/db]`.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct SentinelUrl {
    pub(crate) sentinels: Vec<(String, u16)>,
    pub(crate) service: String,
    pub(crate) db: i64,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
}

impl std::fmt::Debug for SentinelUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelUrl")
            .field("sentinels", &self.sentinels)
            .field("service", &self.service)
            .field("db", &self.db)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish()
    }
}

fn malformed(why: impl std::fmt::Display) -> Error {
    Error::InvalidInput(InvalidInput::MalformedUrl(format!(
        "redis+sentinel URL: {why} (expected \
         redis+sentinel://[user][:password@]host[:port][,host[:port]...]/service[/db])"
    )))
}

fn decode(part: &str, what: &str) -> Result<String> {
    lease_core::raw::url::percent_decode(part).map_err(|e| malformed(format!("the {what}: {e}")))
}

impl SentinelUrl {
    /// Parses `url`. Errors never show the password.
    pub(crate) fn parse(url: &str) -> Result<Self> {
        if !is_sentinel_url(url) {
            return Err(malformed("not a redis+sentinel:// URL"));
        }
        lease_core::raw::url::check_url_userinfo(url)?;
        let rest = &url[SCHEME.len()..];
        if rest.contains(['?', '#']) {
            return Err(malformed(
                "query parameters and fragments are not supported",
            ));
        }
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(u) => {
                let (user, pass) = match u.split_once(':') {
                    Some((user, pass)) => (user, Some(pass)),
                    None => (u, None),
                };
                let user = (!user.is_empty())
                    .then(|| decode(user, "user name"))
                    .transpose()?;
                let pass = pass.map(|p| decode(p, "password")).transpose()?;
                (user, pass)
            }
        };
        let mut sentinels = Vec::new();
        for host in hosts.split(',') {
            if host.is_empty() {
                return Err(malformed("an empty sentinel address"));
            }
            let (h, port) = match host.rsplit_once(':') {
                Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => {
                    let port = p.parse::<u16>().map_err(|_| {
                        malformed(format!("port {p:?} of sentinel {h:?} is not a number"))
                    })?;
                    (h, port)
                }
                _ => (host, DEFAULT_PORT),
            };
            if h.is_empty() || h.contains(['@', ' ']) {
                return Err(malformed(format!("sentinel host {h:?}")));
            }
            sentinels.push((h.to_owned(), port));
        }
        let mut segments = path.split('/').filter(|s| !s.is_empty());
        let service = segments
            .next()
            .map(|s| decode(s, "service name"))
            .transpose()?
            .ok_or_else(|| malformed("no service name"))?;
        let db = match segments.next() {
            None => 0,
            Some(d) => d
                .parse::<i64>()
                .ok()
                .filter(|d| *d >= 0)
                .ok_or_else(|| malformed(format!("database {d:?} is not a number")))?,
        };
        if segments.next().is_some() {
            return Err(malformed("too many path segments"));
        }
        Ok(SentinelUrl {
            sentinels,
            service,
            db,
            username,
            password,
        })
    }

    /// The sentinels and the service, for logs and `Debug` (no credentials).
    pub(crate) fn describe(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|(h, p)| format!("{h}:{p}"))
            .collect();
        format!("sentinel {} via {}", self.service, hosts.join(","))
    }

    /// A client that asks the sentinels for the service's primary.
    pub(crate) fn client(&self) -> Result<SentinelClient> {
        let mut info = RedisConnectionInfo::default().set_db(self.db);
        if let Some(u) = &self.username {
            info = info.set_username(u);
        }
        if let Some(p) = &self.password {
            info = info.set_password(p);
        }
        let node = SentinelNodeConnectionInfo::default().set_redis_connection_info(info);
        let addrs: Vec<String> = self
            .sentinels
            .iter()
            .map(|(h, p)| format!("redis://{h}:{p}/"))
            .collect();
        SentinelClient::build(
            addrs,
            self.service.clone(),
            Some(node),
            SentinelServerType::Master,
        )
        .map_err(|e| convert("connect", std::time::Duration::ZERO, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sentinel_urls() {
        let u = SentinelUrl::parse("redis+sentinel://a:1,b,c:3/mymaster/2").unwrap();
        assert_eq!(
            u.sentinels,
            vec![
                ("a".to_owned(), 1),
                ("b".to_owned(), 26379),
                ("c".to_owned(), 3)
            ]
        );
        assert_eq!(u.service, "mymaster");
        assert_eq!(u.db, 2);
        assert_eq!(u.username, None);
        let u = SentinelUrl::parse("REDIS+SENTINEL://us%40r:p%3Ass@h/svc").unwrap();
        assert_eq!(u.username.as_deref(), Some("us@r"));
        assert_eq!(u.password.as_deref(), Some("p:ss"));
        assert_eq!(u.db, 0);
        let u = SentinelUrl::parse("redis+sentinel://:secret@h:5/svc").unwrap();
        assert_eq!(u.username, None);
        assert_eq!(u.password.as_deref(), Some("secret"));
        assert!(!format!("{u:?}").contains("secret"));
        assert!(!u.describe().contains("secret"));
    }

    #[test]
    fn rejects_bad_sentinel_urls_without_echoing_passwords() {
        for bad in [
            "redis+sentinel://h:1",
            "redis+sentinel://h:1/",
            "redis+sentinel://:pw-secret@h:x/svc",
            // Issue 31, finding 4: cut at the '/', this was "port \"pw-secret\"".
            "redis+sentinel://:pw-secret/x@h/svc",
            "redis+sentinel://:pw-secret#x@h/svc",
            "redis+sentinel://h:1,,h:2/svc",
            "redis+sentinel://h:1/svc/-1",
            "redis+sentinel://h:1/svc/0/x",
            "redis+sentinel://h:1/svc?x=1",
            "redis://h:1/svc",
        ] {
            let e = SentinelUrl::parse(bad).unwrap_err();
            assert!(
                matches!(e, Error::InvalidInput(InvalidInput::MalformedUrl(_))),
                "{bad}: {e}"
            );
            assert!(!e.to_string().contains("pw-secret"), "{e}");
        }
    }
}
