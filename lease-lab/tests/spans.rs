//! The tracing audit, on real stores: every store call the client makes is a span
//! `lease.store` carrying the backend, the operation, the lease name, the owner (holder
//! label), the outcome and the duration; and no span field or event, at any level and
//! from any crate (the backends' and their drivers' included), carries the password of
//! the URL the backend was opened with.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use leasehold::{HolderLabel, LeaseClient, LeaseOptions};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// A span as the capture saw it: its name and every field recorded on it.
#[derive(Clone, Debug, Default)]
struct SpanSeen {
    name: &'static str,
    fields: HashMap<String, String>,
}

#[derive(Default)]
struct Captured {
    spans: HashMap<u64, SpanSeen>,
    /// Closed spans, in the order they closed.
    closed: Vec<SpanSeen>,
    /// Every field value and event message, for the secret check.
    text: String,
}

fn captured() -> &'static Mutex<Captured> {
    static CAPTURED: OnceLock<Mutex<Captured>> = OnceLock::new();
    CAPTURED.get_or_init(|| {
        let subscriber = tracing_subscriber::registry().with(Capture);
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
        Mutex::new(Captured::default())
    })
}

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

struct Capture;

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut seen = SpanSeen {
            name: attrs.metadata().name(),
            fields: HashMap::new(),
        };
        attrs.record(&mut Fields(&mut seen.fields));
        let mut c = captured().lock().unwrap();
        for v in seen.fields.values() {
            let _ = writeln!(c.text, "{v}");
        }
        c.spans.insert(id.into_u64(), seen);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut fields = HashMap::new();
        values.record(&mut Fields(&mut fields));
        let mut c = captured().lock().unwrap();
        for v in fields.values() {
            let _ = writeln!(c.text, "{v}");
        }
        if let Some(s) = c.spans.get_mut(&id.into_u64()) {
            s.fields.extend(fields);
        }
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut fields = HashMap::new();
        event.record(&mut Fields(&mut fields));
        let mut c = captured().lock().unwrap();
        for v in fields.values() {
            let _ = writeln!(c.text, "{v}");
        }
    }

    fn on_close(&self, id: Id, _: Context<'_, S>) {
        let mut c = captured().lock().unwrap();
        if let Some(s) = c.spans.remove(&id.into_u64()) {
            c.closed.push(s);
        }
    }
}

/// The closed `lease.store` spans of lease `name` (or of renewal batches when `None`).
fn store_spans(op: &str, name: Option<&str>) -> Vec<SpanSeen> {
    let c = captured().lock().unwrap();
    c.closed
        .iter()
        .filter(|s| s.name == "lease.store" && s.fields.get("op").map(String::as_str) == Some(op))
        .filter(|s| name.is_none_or(|n| s.fields.get("lease").map(String::as_str) == Some(n)))
        .cloned()
        .collect()
}

fn assert_no_secret(secret: &str) {
    let c = captured().lock().unwrap();
    assert!(
        !c.text.contains(secret),
        "a span or event carried the password"
    );
    for s in c.spans.values().chain(&c.closed) {
        for v in s.fields.values() {
            assert!(!v.contains(secret), "span {} carried the password", s.name);
        }
    }
}

/// Opens `url` (which carries `secret`), acquires, renews and releases one lease, and
/// checks the spans of each store call and that the secret appears nowhere.
async fn audit(store: &str, url: &str, secret: &str) {
    let _ = captured();
    let backend = leasehold::connect(url).await.expect("connect");
    let label = HolderLabel::new(format!("audit-{store}")).unwrap();
    let client = LeaseClient::with_label(backend, label);
    let name = format!("spans/{store}/{}", uuid::Uuid::new_v4().simple());
    let opts = LeaseOptions::builder(Duration::from_secs(2))
        .renew_every(Duration::from_millis(100))
        .build()
        .unwrap();
    let guard = client.acquire(&name, &opts).await.expect("acquire");
    // Two renewals at least.
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    while store_spans("renew", None)
        .iter()
        .filter(|s| s.fields.get("backend").map(String::as_str) == Some(store))
        .count()
        < 2
    {
        assert!(
            tokio::time::Instant::now() < until,
            "{store}: no renewals seen"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    guard.release().await.expect("release");

    let check = |op: &str, outcome: &str| {
        let spans = store_spans(op, Some(&name));
        let span = spans
            .first()
            .unwrap_or_else(|| panic!("{store}: no {op} span for {name}"));
        let f = &span.fields;
        assert_eq!(
            f.get("backend").map(String::as_str),
            Some(store),
            "{span:?}"
        );
        assert_eq!(
            f.get("owner").map(String::as_str),
            Some(format!("audit-{store}").as_str()),
            "{span:?}"
        );
        assert_eq!(
            f.get("outcome").map(String::as_str),
            Some(outcome),
            "{span:?}"
        );
        let ms: f64 = f["duration_ms"].parse().expect("duration_ms a number");
        assert!(ms > 0.0 && ms < 5000.0, "{span:?}");
    };
    check("acquire", "acquired");
    check("release", "released");
    let renew = store_spans("renew", None);
    let renew = renew
        .iter()
        .find(|s| s.fields.get("backend").map(String::as_str) == Some(store))
        .unwrap();
    assert_eq!(
        renew.fields.get("outcome").map(String::as_str),
        Some("renewed"),
        "{renew:?}"
    );
    assert!(renew.fields.contains_key("leases"), "{renew:?}");
    assert!(renew.fields.contains_key("duration_ms"), "{renew:?}");
    assert_no_secret(secret);
}

/// A URL with `user:secret` in place of its credentials.
fn with_credentials(url: &str, user: &str, secret: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let rest = rest.split_once('@').map_or(rest, |(_, r)| r);
    format!("{scheme}://{user}:{secret}@{rest}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_spans_and_no_password() {
    let secret = "redis-pw-Xq81";
    let server = lease_test_servers::RedisServer::start_local_with_args(vec![
        "--requirepass".into(),
        secret.into(),
    ])
    .await
    .unwrap();
    // A wrong password first: refused, and neither the error nor a span shows it.
    let wrong = with_credentials(&server.url(), "default", "wrong-pw-Zk22");
    let err = leasehold::connect(&wrong)
        .await
        .expect_err("wrong password");
    assert!(
        !format!("{err} {err:?}").contains("wrong-pw-Zk22"),
        "{err:?}"
    );
    assert_no_secret("wrong-pw-Zk22");
    audit(
        "redis",
        &with_credentials(&server.url(), "default", secret),
        secret,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_spans_and_no_password() {
    let secret = "pg-pw-Hy93";
    let db = lease_test_servers::PostgresServer::shared().await.unwrap();
    let role = format!("audit_{}", uuid::Uuid::new_v4().simple());
    db.sql(&format!(
        "CREATE ROLE {role} LOGIN PASSWORD '{secret}'; GRANT ALL ON SCHEMA public TO {role}"
    ))
    .unwrap();
    audit(
        "postgres",
        &with_credentials(&db.url(), &role, secret),
        secret,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_spans_and_no_password() {
    let secret = "my-pw-Lc47";
    let db = lease_test_servers::MariaDbServer::shared().await.unwrap();
    let user = format!("a{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let database = db.name().expect("a database of its own").to_owned();
    db.sql(&format!(
        "CREATE USER '{user}'@'%' IDENTIFIED BY '{secret}'; \
         GRANT ALL ON `{database}`.* TO '{user}'@'%'"
    ))
    .unwrap();
    audit("mysql", &with_credentials(&db.url(), &user, secret), secret).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_spans_and_no_password() {
    let server = lease_test_servers::EtcdServer::start().await.unwrap();
    // The server has no users: credentials are refused, and not shown.
    let wrong = with_credentials(&server.url(), "root", "etcd-pw-Vb65");
    if let Err(err) = leasehold::connect(&wrong).await {
        assert!(
            !format!("{err} {err:?}").contains("etcd-pw-Vb65"),
            "{err:?}"
        );
    }
    assert_no_secret("etcd-pw-Vb65");
    audit("etcd", &server.url(), "etcd-pw-Vb65").await;
}
