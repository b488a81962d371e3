//! Helpers that backends' own test files share: fresh names and owners, one lease cycle
//! on a connection, and what a refused connection must say. Each store's TLS and
//! credentials tests use them, so that "a TLS failure" and "wrong credentials" mean the
//! same thing on every store.

use std::time::Duration;

use lease_core::{
    AcquireOutcome, Error, HolderLabel, LeaseBackend, LeaseName, Owner, RenewItem, RenewOutcome,
};

/// A lease name no other test uses: `what-<random>`.
pub fn unique_name(what: &str) -> LeaseName {
    LeaseName::new(format!("{what}-{}", uuid::Uuid::new_v4().simple())).expect("a valid name")
}

/// A new owner (a fresh token) with the holder label `label`.
pub fn owner(label: &str) -> Owner {
    Owner::new(HolderLabel::new(label).expect("a valid label"))
}

/// One acquire, renewal, inspection and release on `backend`: the connection works for
/// leases. Fencing tokens, where the backend gives them, are positive and inspected
/// back.
pub async fn cycle(backend: &dyn LeaseBackend) {
    let owner = owner("cycle");
    let name = unique_name("cycle");
    let ttl = Duration::from_secs(10);
    let fencing = match backend.acquire(&name, &owner, ttl).await.expect("acquire") {
        AcquireOutcome::Acquired { fencing, .. } => fencing,
        AcquireOutcome::Held(by) => panic!("a fresh name was held by {by}"),
    };
    let renewed = backend
        .renew(
            &[RenewItem {
                name: name.clone(),
                token: owner.token,
            }],
            ttl,
        )
        .await
        .expect("renew");
    assert!(
        matches!(renewed.as_slice(), [RenewOutcome::Renewed]),
        "{renewed:?}"
    );
    let info = backend
        .inspect(&name)
        .await
        .expect("inspect")
        .expect("held");
    if backend.capabilities().fencing != lease_core::Fencing::None {
        assert!(fencing.get() > 0);
        assert_eq!(info.fencing, Some(fencing));
    }
    backend
        .release(&name, &owner.token, Duration::ZERO)
        .await
        .expect("release");
    assert!(backend.inspect(&name).await.expect("inspect").is_none());
}

/// `result` is an [`Error::Tls`], not retryable, whose message contains `says`; returns
/// the message.
pub fn expect_tls<T>(result: Result<T, Error>, says: &str) -> String {
    match result {
        Err(e @ Error::Tls { .. }) => {
            assert!(
                !e.is_retryable(),
                "a TLS failure must not be retryable: {e}"
            );
            let text = e.to_string();
            assert!(text.contains(says), "wanted {says:?} in: {text}");
            text
        }
        Err(e) => panic!("wanted a TLS error ({says}), got {e:?}"),
        Ok(_) => panic!("wanted a TLS error ({says}), connected"),
    }
}

/// `result` is an [`Error::Auth`], not retryable, whose message contains `says` and
/// neither whose message nor `Debug` shows `secret`; returns the message.
pub fn expect_auth<T>(result: Result<T, Error>, says: &str, secret: &str) -> String {
    match result {
        Err(e @ Error::Auth { .. }) => {
            assert!(
                !e.is_retryable(),
                "wrong credentials must not be retryable: {e}"
            );
            let text = e.to_string();
            assert!(text.contains(says), "wanted {says:?} in: {text}");
            assert!(
                !format!("{text} {e:?}").contains(secret),
                "the error shows the secret: {e:?}"
            );
            text
        }
        Err(e) => panic!("wanted an authentication error ({says}), got {e:?}"),
        Ok(_) => panic!("wanted an authentication error ({says}), connected"),
    }
}
