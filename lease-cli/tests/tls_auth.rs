//! The README's "Production connections" table through the `lease` command: TLS, mutual
//! TLS (`--tls-ca`, `--tls-cert`, `--tls-key` and their environment variables), passwords,
//! ACL users and least-privilege roles on real Redis, PostgreSQL, etcd and MariaDB servers, with
//! certificates made at test time; wrong credentials exit 77, TLS failures 78, and no
//! password is ever printed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::path::Path;
use std::process::Stdio;

use lease_test_servers::redis::{LEASE_USER_ACL, tls_args};
use lease_test_servers::{
    EtcdServer, MariaDbServer, PostgresServer, RedisServer, TestCerts, free_port,
};
use tokio::process::Command;

const LEASE: &str = env!("CARGO_BIN_EXE_lease");
const EXIT_AUTH: i32 = 77;
const EXIT_TLS: i32 = 78;

/// Runs `lease ARGS` with `env`; returns the exit code and stdout + stderr.
async fn lease(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut c = Command::new(LEASE);
    c.args(args)
        .env_remove("LEASE_LOG")
        .env_remove("LEASE_BACKEND")
        .env_remove("LEASE_TLS_CA")
        .env_remove("LEASE_TLS_CERT")
        .env_remove("LEASE_TLS_KEY")
        .env_remove("PGPASSWORD")
        .env_remove("PGPASSFILE")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().await.unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// `lease exec` of a command that prints its fencing token: the whole cycle (acquire,
/// renew while it runs, release) works.
async fn exec_ok(backend: &str, tls: &[&str], env: &[(&str, &str)]) {
    let name = format!("cli-tls-{}", uuid::Uuid::new_v4().simple());
    let mut args = vec!["--backend", backend];
    args.extend_from_slice(tls);
    args.extend_from_slice(&[
        "exec",
        "--ttl",
        "3s",
        &name,
        "--",
        "sh",
        "-c",
        "sleep 0.5; echo token=$LEASE_FENCING_TOKEN",
    ]);
    let (code, out) = lease(&args, env).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("token="), "{out}");
}

/// `lease status` fails with `code`, saying `says`, and without `secret`.
async fn status_fails(
    backend: &str,
    tls: &[&str],
    env: &[(&str, &str)],
    code: i32,
    says: &str,
    secret: &str,
) {
    let mut args = vec!["--backend", backend];
    args.extend_from_slice(tls);
    args.extend_from_slice(&["status", "some-job"]);
    let (got, out) = lease(&args, env).await;
    assert_eq!(got, code, "{out}");
    assert!(out.contains(says), "wanted {says:?} in: {out}");
    assert!(!out.contains(secret), "the secret was printed: {out}");
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

fn sh(program: &str, args: &[&str]) {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_tls_mtls_password_and_acl_user() {
    let certs = TestCerts::generate().unwrap_or_else(|e| panic!("{e}"));
    let tls_port = free_port().unwrap();
    let mut args = tls_args(&certs, tls_port, "optional");
    args.extend(["--requirepass".into(), "default-pw".into()]);
    let server = RedisServer::start_local_with_args(args)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let port = server.port().unwrap().to_string();
    let mut setuser = vec![
        "-p",
        &port,
        "--no-auth-warning",
        "-a",
        "default-pw",
        "ACL",
        "SETUSER",
        "leaser",
        ">user-pw",
    ];
    setuser.extend_from_slice(LEASE_USER_ACL);
    sh("redis-cli", &setuser);
    let (ca, other, cert, key) = (
        s(&certs.ca),
        s(&certs.other_ca),
        s(&certs.client_cert),
        s(&certs.client_key),
    );
    let tls_url = format!("rediss://leaser:user-pw@127.0.0.1:{tls_port}/");
    // TLS with --tls-ca, and with LEASE_TLS_CA.
    exec_ok(&tls_url, &["--tls-ca", &ca], &[]).await;
    exec_ok(&tls_url, &[], &[("LEASE_TLS_CA", &ca)]).await;
    // Mutual TLS, from flags and from the environment.
    exec_ok(
        &tls_url,
        &["--tls-ca", &ca, "--tls-cert", &cert, "--tls-key", &key],
        &[],
    )
    .await;
    exec_ok(
        &tls_url,
        &[],
        &[
            ("LEASE_TLS_CA", &ca),
            ("LEASE_TLS_CERT", &cert),
            ("LEASE_TLS_KEY", &key),
        ],
    )
    .await;
    // A wrong CA, a wrong host name, a missing key file: exit 78.
    status_fails(
        &tls_url,
        &["--tls-ca", &other],
        &[],
        EXIT_TLS,
        "not signed by a CA you trust",
        "user-pw",
    )
    .await;
    let localhost = format!("rediss://leaser:user-pw@localhost:{tls_port}/");
    status_fails(
        &localhost,
        &["--tls-ca", &ca],
        &[],
        EXIT_TLS,
        "not valid for the host name",
        "user-pw",
    )
    .await;
    status_fails(
        &tls_url,
        &["--tls-ca", &ca, "--tls-cert", &cert],
        &[],
        EXIT_TLS,
        "without its key",
        "user-pw",
    )
    .await;
    // rediss:// to the plain port: the server waits for the rest of a line; the backend
    // finds the port answers a plain PING: exit 78, not a timeout.
    let tls_to_plain = format!("rediss://leaser:user-pw@127.0.0.1:{port}/");
    status_fails(
        &tls_to_plain,
        &["--tls-ca", &ca],
        &[],
        EXIT_TLS,
        "speaks plain text",
        "user-pw",
    )
    .await;
    // A password alone (the default user), and the ACL user, in plain text.
    exec_ok(&format!("redis://:default-pw@127.0.0.1:{port}/"), &[], &[]).await;
    exec_ok(
        &format!("redis://leaser:user-pw@127.0.0.1:{port}/"),
        &[],
        &[],
    )
    .await;
    // Wrong or missing credentials: exit 77, the password not printed.
    let wrong = format!("redis://leaser:not-it@127.0.0.1:{port}/");
    status_fails(
        &wrong,
        &[],
        &[],
        EXIT_AUTH,
        "refused the credentials",
        "not-it",
    )
    .await;
    let none = format!("redis://127.0.0.1:{port}/");
    status_fails(
        &none,
        &[],
        &[],
        EXIT_AUTH,
        "refused the credentials",
        "default-pw",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_tls_mtls_scram_pgpassword_pgpass_and_least_privilege() {
    let certs = TestCerts::generate().unwrap_or_else(|e| panic!("{e}"));
    let server = PostgresServer::start_fast()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    server
        .enable_tls(
            &certs,
            &[
                "hostssl all lease_client 127.0.0.1/32 cert",
                "host all lease_client 127.0.0.1/32 reject",
                "host all all 127.0.0.1/32 scram-sha-256",
            ],
        )
        .unwrap_or_else(|e| panic!("{e}"));
    // The DDL the README gives for migrations.
    let ddl = leasehold::postgres::schema_sql("lease_locks").unwrap();
    for sql in [
        ddl.as_str(),
        "CREATE ROLE lease_app LOGIN PASSWORD 'app-pw'",
        "CREATE ROLE lease_client LOGIN",
        "GRANT SELECT, INSERT, UPDATE, DELETE ON public.lease_locks TO lease_app, lease_client",
    ] {
        server
            .sql("postgres", sql)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let port = server.port().unwrap();
    let (ca, other, cert, key) = (
        s(&certs.ca),
        s(&certs.other_ca),
        s(&certs.client_cert),
        s(&certs.client_key),
    );
    let app = format!("postgres://lease_app:app-pw@127.0.0.1:{port}/postgres");
    // TLS: a CA given and no sslmode means verify-full; libpq's parameters work too.
    exec_ok(&app, &["--tls-ca", &ca], &[]).await;
    exec_ok(
        &format!("{app}?sslmode=verify-full&sslrootcert={ca}"),
        &[],
        &[],
    )
    .await;
    status_fails(
        &app,
        &["--tls-ca", &other],
        &[],
        EXIT_TLS,
        "not signed by a CA you trust",
        "app-pw",
    )
    .await;
    let localhost = format!("postgres://lease_app:app-pw@localhost:{port}/postgres");
    status_fails(
        &localhost,
        &["--tls-ca", &ca],
        &[],
        EXIT_TLS,
        "not valid for the host name",
        "app-pw",
    )
    .await;
    // Mutual TLS: the certificate is the login of lease_client.
    let client = format!("postgres://lease_client@127.0.0.1:{port}/postgres");
    exec_ok(
        &client,
        &["--tls-ca", &ca, "--tls-cert", &cert, "--tls-key", &key],
        &[],
    )
    .await;
    status_fails(
        &client,
        &["--tls-ca", &ca],
        &[],
        EXIT_AUTH,
        "certificate",
        "no secret",
    )
    .await;
    // SCRAM password in the URL (lease_app has only SELECT, INSERT, UPDATE and DELETE on
    // the table: least privilege), in PGPASSWORD, and in ~/.pgpass.
    exec_ok(&format!("{app}?sslmode=disable"), &[], &[]).await;
    let bare = format!("postgres://lease_app@127.0.0.1:{port}/postgres?sslmode=disable");
    exec_ok(&bare, &[], &[("PGPASSWORD", "app-pw")]).await;
    let home = tempfile::tempdir().unwrap();
    let pgpass = home.path().join(".pgpass");
    std::fs::write(&pgpass, format!("127.0.0.1:{port}:*:lease_app:app-pw\n")).unwrap();
    std::fs::set_permissions(&pgpass, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    exec_ok(&bare, &[], &[("HOME", &s(home.path()))]).await;
    // Wrong or missing password: exit 77, not printed.
    let wrong = format!("postgres://lease_app:not-it@127.0.0.1:{port}/postgres?sslmode=disable");
    status_fails(
        &wrong,
        &[],
        &[],
        EXIT_AUTH,
        "password authentication failed",
        "not-it",
    )
    .await;
    status_fails(
        &bare,
        &[],
        &[("PGPASSWORD", "wrong-env-pw")],
        EXIT_AUTH,
        "password authentication failed",
        "wrong-env-pw",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_tls_mtls_password_and_prefix_role() {
    let certs = TestCerts::generate().unwrap_or_else(|e| panic!("{e}"));
    let (server, https) = EtcdServer::start_local_tls(&certs, true)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let http = server.endpoints()[0].clone();
    let ctl = |args: &[&str]| {
        let mut all = vec!["--endpoints", http.as_str()];
        all.extend_from_slice(args);
        sh("etcdctl", &all);
    };
    ctl(&["user", "add", "root:root-pw"]);
    ctl(&["user", "grant-role", "root", "root"]);
    ctl(&["role", "add", "lease-rw"]);
    ctl(&[
        "role",
        "grant-permission",
        "lease-rw",
        "--prefix=true",
        "readwrite",
        "app/",
    ]);
    ctl(&["user", "add", "leaser:user-pw"]);
    ctl(&["user", "grant-role", "leaser", "lease-rw"]);
    ctl(&["auth", "enable"]);
    let at = https.trim_start_matches("https://");
    let plain_at = http.trim_start_matches("http://");
    let (ca, other, cert, key) = (
        s(&certs.ca),
        s(&certs.other_ca),
        s(&certs.client_cert),
        s(&certs.client_key),
    );
    let mtls = [
        "--tls-ca",
        ca.as_str(),
        "--tls-cert",
        cert.as_str(),
        "--tls-key",
        key.as_str(),
    ];
    // Mutual TLS with the prefix-limited user (the TLS port requires a client
    // certificate; etcd checks it against its CA).
    let secure = format!("etcds://leaser:user-pw@{at}/app");
    exec_ok(&secure, &mtls, &[]).await;
    exec_ok(
        &secure,
        &[],
        &[
            ("LEASE_TLS_CA", &ca),
            ("LEASE_TLS_CERT", &cert),
            ("LEASE_TLS_KEY", &key),
        ],
    )
    .await;
    status_fails(
        &secure,
        &["--tls-ca", &ca],
        &[],
        EXIT_TLS,
        "requires a client certificate",
        "user-pw",
    )
    .await;
    status_fails(
        &secure,
        &["--tls-ca", &other, "--tls-cert", &cert, "--tls-key", &key],
        &[],
        EXIT_TLS,
        "not signed by a CA you trust",
        "user-pw",
    )
    .await;
    // Passwords on the plain port: root, and the prefix-limited user.
    exec_ok(&format!("etcd://root:root-pw@{plain_at}/app"), &[], &[]).await;
    exec_ok(&format!("etcd://leaser:user-pw@{plain_at}/app"), &[], &[]).await;
    // Outside its prefix: refused (a store error, 69), not a credentials error.
    let (code, out) = lease(
        &[
            "--backend",
            &format!("etcd://leaser:user-pw@{plain_at}/other"),
            "exec",
            "x",
            "--",
            "true",
        ],
        &[],
    )
    .await;
    assert_eq!(code, 69, "{out}");
    assert!(out.contains("permission denied"), "{out}");
    // TLS without client certificates, on a second server: the CA from the flag and
    // from the environment; another CA, and a host name the certificate does not list.
    let (_tls_only, https) = EtcdServer::start_local_tls(&certs, false)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let tls_at = https.trim_start_matches("https://");
    let tls_url = format!("etcds://{tls_at}/app");
    exec_ok(&tls_url, &["--tls-ca", &ca], &[]).await;
    exec_ok(&tls_url, &[], &[("LEASE_TLS_CA", &ca)]).await;
    status_fails(
        &tls_url,
        &["--tls-ca", &other],
        &[],
        EXIT_TLS,
        "not signed by a CA you trust",
        "no secret",
    )
    .await;
    let tls_port = tls_at.rsplit(':').next().unwrap();
    let localhost = format!("etcds://localhost:{tls_port}/app");
    status_fails(
        &localhost,
        &["--tls-ca", &ca],
        &[],
        EXIT_TLS,
        "not valid for the host name",
        "no secret",
    )
    .await;
    // A wrong password: 77, not printed.
    status_fails(
        &format!("etcd://leaser:not-it@{plain_at}/app"),
        &[],
        &[],
        EXIT_AUTH,
        "refused the credentials",
        "not-it",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_tls_mtls_password_and_least_privilege() {
    let certs = TestCerts::generate().unwrap_or_else(|e| panic!("{e}"));
    let server = MariaDbServer::start_tls(&certs)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // The DDL the README gives for migrations, and two users with only SELECT, INSERT and
    // UPDATE on the table: one with a password that must use TLS, one whose client
    // certificate is its login.
    let ddl = leasehold::mysql::schema_sql("lease.lease_locks").unwrap();
    server
        .sql(&format!(
            "{ddl}; \
             CREATE USER 'lease_app'@'%' IDENTIFIED BY 'app-pw' REQUIRE SSL; \
             CREATE USER 'lease_client'@'%' REQUIRE SUBJECT '/CN=lease_client'; \
             GRANT SELECT, INSERT, UPDATE ON lease.lease_locks TO 'lease_app'@'%', 'lease_client'@'%';"
        ))
        .unwrap_or_else(|e| panic!("{e}"));
    let port = server.port().unwrap();
    let (ca, other, cert, key) = (
        s(&certs.ca),
        s(&certs.other_ca),
        s(&certs.client_cert),
        s(&certs.client_key),
    );
    let app = format!("mysql://lease_app:app-pw@127.0.0.1:{port}/lease?create_table=false");
    // TLS: a CA given and no ssl-mode means VERIFY_IDENTITY; the driver's parameters work
    // too.
    exec_ok(&app, &["--tls-ca", &ca], &[]).await;
    exec_ok(&app, &[], &[("LEASE_TLS_CA", &ca)]).await;
    exec_ok(
        &format!("{app}&ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}"),
        &[],
        &[],
    )
    .await;
    status_fails(
        &app,
        &["--tls-ca", &other],
        &[],
        EXIT_TLS,
        "not signed by a CA you trust",
        "app-pw",
    )
    .await;
    let localhost = format!("mysql://lease_app:app-pw@localhost:{port}/lease?create_table=false");
    status_fails(
        &localhost,
        &["--tls-ca", &ca],
        &[],
        EXIT_TLS,
        "not valid for the host name",
        "app-pw",
    )
    .await;
    // A user that must use TLS, without it: the server says "Access denied".
    status_fails(
        &format!("{app}&ssl-mode=DISABLED"),
        &[],
        &[],
        EXIT_AUTH,
        "Access denied",
        "app-pw",
    )
    .await;
    // Mutual TLS: the certificate is the login of lease_client.
    let client = format!("mysql://lease_client@127.0.0.1:{port}/lease?create_table=false");
    exec_ok(
        &client,
        &["--tls-ca", &ca, "--tls-cert", &cert, "--tls-key", &key],
        &[],
    )
    .await;
    status_fails(
        &client,
        &["--tls-ca", &ca],
        &[],
        EXIT_AUTH,
        "Access denied",
        "no secret",
    )
    .await;
    // A wrong password: exit 77, not printed.
    let wrong = format!("mysql://lease_app:not-it@127.0.0.1:{port}/lease?ssl-ca={ca}");
    status_fails(&wrong, &[], &[], EXIT_AUTH, "Access denied", "not-it").await;
}
