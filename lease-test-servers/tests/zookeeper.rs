//! The ZooKeeper harness: a throwaway standalone server from Debian's package answers,
//! says it is standalone and on 3.8, survives a kill and start again with its data, and
//! stops answering while paused.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::Duration;

use lease_test_servers::ZooKeeperServer;

#[tokio::test]
async fn a_standalone_server_starts_restarts_and_pauses() {
    let mut server = ZooKeeperServer::start_local()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let srvr = server.srvr().expect("srvr");
    assert!(srvr.contains("Mode: standalone"), "{srvr}");
    assert!(srvr.contains("Zookeeper version: 3.8"), "{srvr}");
    assert!(server.address().starts_with("127.0.0.1:"));
    server.kill().unwrap();
    assert!(server.srvr().is_none(), "a killed server answered");
    server.start_again().await.unwrap();
    assert!(server.srvr().unwrap().contains("Mode: standalone"));
    server.pause().unwrap();
    let answer = server.srvr();
    assert!(answer.is_none(), "a paused server answered: {answer:?}");
    server.resume().unwrap();
    let by = tokio::time::Instant::now() + Duration::from_secs(5);
    while server.srvr().is_none() {
        assert!(tokio::time::Instant::now() < by, "no answer after resume");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_three_member_ensemble_elects_a_new_leader_when_its_leader_is_killed() {
    use lease_test_servers::ZooKeeperEnsemble;
    let mut ensemble = ZooKeeperEnsemble::start(3)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ensemble.connect_string().split(',').count(), 3);
    let leader = ensemble.leader().expect("a leader");
    ensemble.kill(leader).unwrap();
    let next = ensemble
        .wait_for_leader(Duration::from_secs(30))
        .await
        .unwrap();
    assert_ne!(next, leader);
    ensemble.start_again(leader).await.unwrap();
    assert_eq!(
        ensemble.leader(),
        Some(next),
        "the old leader took over again"
    );
}
