//! The error mapping over real error replies: each row puts a real etcd server into a
//! state that makes it answer with one error, sends a lease call, and checks the kind of
//! error the caller gets and whether it says a retry may help.
//!
//! Not produced here: "etcdserver: too many requests" (`ResourceExhausted` for load
//! shedding, retryable): a server sheds load only when it applies entries far behind what
//! it commits, which a test cannot bring about on purpose; its mapping is covered by the
//! unit test in `error.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::Duration;

use lease_core::{Error, HolderLabel, LeaseBackend, LeaseName, Owner};
use lease_etcd::{EtcdBackend, EtcdConfig, etcd_client};
use lease_test_servers::EtcdServer;

fn owner() -> Owner {
    Owner::new(HolderLabel::new("errors").unwrap())
}

fn name() -> LeaseName {
    LeaseName::new(format!("errors-{}", uuid::Uuid::new_v4().simple())).unwrap()
}

fn config() -> EtcdConfig {
    EtcdConfig::default()
        .with_request_timeout(Duration::from_secs(2))
        .with_connect_timeout(Duration::from_secs(2))
}

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Kind {
    Rejected,
    Auth,
    Unavailable,
}

fn check<T: std::fmt::Debug>(
    table: &mut Vec<String>,
    what: &str,
    says: &str,
    r: lease_core::Result<T>,
    want: Kind,
) {
    let e = match r {
        Err(e) => e,
        Ok(v) => panic!("{what}: expected an error, got {v:?}"),
    };
    let got = match &e {
        Error::Rejected { .. } => Kind::Rejected,
        Error::Auth { .. } => Kind::Auth,
        Error::Unavailable { .. } => Kind::Unavailable,
        other => panic!("{what}: {other:?}"),
    };
    assert_eq!(got, want, "{what}: {e:?}");
    assert_eq!(e.is_retryable(), want == Kind::Unavailable, "{what}: {e}");
    assert!(e.to_string().contains(says), "{what}: {e}");
    table.push(format!(
        "| {what} | {want:?} | {} | {e} |",
        e.is_retryable()
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_error_replies_map_to_typed_errors() {
    let ttl = Duration::from_secs(30);
    let mut table = Vec::new();

    // "request is too large": a request over the server's --max-request-bytes.
    let small = EtcdServer::start_local_with(&["--max-request-bytes=512"])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let b = EtcdBackend::connect_endpoints(&small.endpoints(), config())
        .await
        .unwrap();
    let long = LeaseName::new("x".repeat(LeaseName::MAX_LEN)).unwrap();
    check(
        &mut table,
        "InvalidArgument: request is too large",
        "request is too large",
        b.acquire(&long, &owner(), ttl).await,
        Kind::Rejected,
    );
    drop(small);

    // "mvcc: database space exceeded": the NOSPACE alarm after the quota filled up.
    let tiny = EtcdServer::start_local_with(&["--quota-backend-bytes=1048576"])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut raw = etcd_client::Client::connect(tiny.endpoints(), None)
        .await
        .unwrap();
    let blob = vec![b'x'; 64 * 1024];
    for i in 0..1000 {
        if raw
            .put(format!("fill/{i}"), blob.clone(), None)
            .await
            .is_err()
        {
            break;
        }
    }
    let b = EtcdBackend::connect_endpoints(&tiny.endpoints(), config()).await;
    match b {
        Ok(b) => check(
            &mut table,
            "ResourceExhausted: database space exceeded",
            "space exceeded",
            b.acquire(&name(), &owner(), ttl).await,
            Kind::Rejected,
        ),
        // The session lease is a write too: refused at connect.
        Err(e) => check::<()>(
            &mut table,
            "ResourceExhausted: database space exceeded (at connect)",
            "space exceeded",
            Err(e),
            Kind::Rejected,
        ),
    }
    drop(tiny);

    // Authentication: a wrong password, and a user without permission on the prefix.
    let server = EtcdServer::start_local()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut raw = etcd_client::Client::connect(server.endpoints(), None)
        .await
        .unwrap();
    raw.user_add("root", "rootpw", None).await.unwrap();
    raw.user_grant_role("root", "root").await.unwrap();
    raw.user_add("outsider", "pw", None).await.unwrap();
    raw.auth_enable().await.unwrap();
    let wrong = config()
        .with_user(Some("root".into()))
        .with_password(Some("not-the-password".into()));
    check(
        &mut table,
        "InvalidArgument: authentication failed",
        "authentication failed",
        EtcdBackend::connect_endpoints(&server.endpoints(), wrong).await,
        Kind::Auth,
    );
    let outsider = config()
        .with_user(Some("outsider".into()))
        .with_password(Some("pw".into()));
    let denied = match EtcdBackend::connect_endpoints(&server.endpoints(), outsider).await {
        Ok(b) => b.acquire(&name(), &owner(), ttl).await.map(|_| ()),
        Err(e) => Err(e),
    };
    check(
        &mut table,
        "PermissionDenied: permission denied",
        "permission denied",
        denied,
        Kind::Rejected,
    );

    // The server gone: unavailable, retryable.
    let mut gone = EtcdServer::start_local()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let b = EtcdBackend::connect_endpoints(&gone.endpoints(), config())
        .await
        .unwrap();
    gone.kill().unwrap();
    check(
        &mut table,
        "Unavailable: server gone",
        "unreachable",
        b.acquire(&name(), &owner(), ttl).await,
        Kind::Unavailable,
    );

    eprintln!(
        "| reply | kind | retryable | error |\n|---|---|---|---|\n{}",
        table.join("\n")
    );
}
