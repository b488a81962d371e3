//! `connect(url)`: schemes, stores not compiled in, malformed URLs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use leasehold::{Error, InvalidInput};

#[tokio::test]
async fn memory_url_connects() {
    let b = leasehold::connect("memory://").await.unwrap();
    assert_eq!(b.capabilities().backend, "memory");
}

#[tokio::test]
async fn unknown_scheme_and_malformed_urls_are_typed_errors() {
    for url in ["ftp://x", "no-scheme-here", ""] {
        match leasehold::connect(url).await {
            Err(Error::InvalidInput(InvalidInput::MalformedUrl(msg))) => assert!(!msg.is_empty()),
            other => panic!("{url}: expected MalformedUrl, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn errors_never_contain_the_password() {
    for url in [
        "redis://user:s3cret@[bad-host:1/",
        "postgres://u:s3cret@:bad/db",
        "etcd://u:s3cret@",
        "zk://u:s3cret@h:0/p",
        "zk://u:s3cret@h:2181/a/../b",
    ] {
        if let Err(e) = leasehold::connect(url).await {
            assert!(!e.to_string().contains("s3cret"), "{e}");
            assert!(!format!("{e:?}").contains("s3cret"), "{e:?}");
        }
    }
}

#[cfg(not(feature = "etcd"))]
#[tokio::test]
async fn store_not_compiled_in_names_the_feature() {
    match leasehold::connect("etcd://127.0.0.1:2379").await {
        Err(Error::NotCompiledIn { feature, .. }) => assert_eq!(feature, "etcd"),
        other => panic!("expected NotCompiledIn, got {other:?}"),
    }
}

/// `zk://` opens the ZooKeeper backend on a real server, with the URL's prefix.
#[tokio::test]
async fn zk_url_connects_to_zookeeper() {
    let servers = lease_test_servers::ZooKeeperServer::shared().await.unwrap();
    let url = format!("zk://{servers}/leasehold-connect-test");
    let b = leasehold::connect(&url).await.unwrap();
    assert_eq!(b.capabilities().backend, "zookeeper");
    let name = leasehold::LeaseName::new("facade").unwrap();
    let owner = leasehold::Owner::new(leasehold::HolderLabel::new("t").unwrap());
    let got = b
        .acquire(&name, &owner, std::time::Duration::from_secs(5))
        .await
        .unwrap();
    assert!(
        matches!(got, leasehold::AcquireOutcome::Acquired { .. }),
        "{got:?}"
    );
    assert!(format!("{b:?}").contains("/leasehold-connect-test"));
}
