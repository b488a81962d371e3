//! Certificates made at test time (with the `openssl` command), for tests of TLS and
//! mutual TLS on real servers.
//!
//! [`TestCerts::generate`] makes, in a temp dir that lives as long as the handle:
//!
//! - a CA (`ca`), and a second, unrelated CA (`other_ca`) for "wrong CA" cases;
//! - a server certificate signed by `ca`, valid for `IP:127.0.0.1` only (so that
//!   connecting by the name `localhost` is a host-name mismatch);
//! - a client certificate signed by `ca` (common name [`TestCerts::CLIENT_CN`]), and one
//!   signed by `other_ca` that a server must refuse.
//!
//! Keys are P-256 (quick to make); certificates are valid for two days.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::HarnessError;

/// A set of certificates in a temp dir (removed on drop).
#[derive(Debug)]
pub struct TestCerts {
    dir: tempfile::TempDir,
    /// The CA certificate that signed the server and client certificates.
    pub ca: PathBuf,
    /// A CA that signed nothing the servers use.
    pub other_ca: PathBuf,
    /// Server certificate (SAN `IP:127.0.0.1`).
    pub server_cert: PathBuf,
    /// Its key.
    pub server_key: PathBuf,
    /// Client certificate signed by `ca`, common name [`TestCerts::CLIENT_CN`].
    pub client_cert: PathBuf,
    /// Its key.
    pub client_key: PathBuf,
    /// Client certificate signed by `other_ca` (same common name).
    pub stranger_cert: PathBuf,
    /// Its key.
    pub stranger_key: PathBuf,
}

impl TestCerts {
    /// Common name of the client certificates (PostgreSQL's `cert` authentication and
    /// etcd's certificate authentication take it as the user name).
    pub const CLIENT_CN: &'static str = "lease_client";

    /// Makes the certificates. Needs the `openssl` command (Debian package `openssl`).
    ///
    /// Errors: [`HarnessError::Unavailable`] when `openssl` is missing;
    /// [`HarnessError::Start`] with openssl's output when a step fails.
    pub fn generate() -> Result<TestCerts, HarnessError> {
        let dir = tempfile::Builder::new()
            .prefix("lease-certs-")
            .tempdir()
            .map_err(|e| HarnessError::io("creating a temp dir for certificates", e))?;
        let p = |name: &str| dir.path().join(name);
        let ca_ext = "basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n";
        let leaf_ext = |san: Option<&str>, usage: &str| {
            let mut ext = format!(
                "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage={usage}\n"
            );
            if let Some(san) = san {
                ext.push_str(&format!("subjectAltName={san}\n"));
            }
            ext
        };
        make_ca(dir.path(), "ca", "lease test CA", ca_ext)?;
        make_ca(dir.path(), "other_ca", "unrelated test CA", ca_ext)?;
        make_leaf(
            dir.path(),
            "server",
            "127.0.0.1",
            "ca",
            // clientAuth too: etcd's gateway connects to its own TLS port with it.
            &leaf_ext(Some("IP:127.0.0.1"), "serverAuth,clientAuth"),
        )?;
        make_leaf(
            dir.path(),
            "client",
            Self::CLIENT_CN,
            "ca",
            &leaf_ext(None, "clientAuth"),
        )?;
        make_leaf(
            dir.path(),
            "stranger",
            Self::CLIENT_CN,
            "other_ca",
            &leaf_ext(None, "clientAuth"),
        )?;
        Ok(TestCerts {
            ca: p("ca.pem"),
            other_ca: p("other_ca.pem"),
            server_cert: p("server.pem"),
            server_key: p("server.key"),
            client_cert: p("client.pem"),
            client_key: p("client.key"),
            stranger_cert: p("stranger.pem"),
            stranger_key: p("stranger.key"),
            dir,
        })
    }

    /// The directory the files are in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

fn openssl(dir: &Path, args: &[&str]) -> Result<(), HarnessError> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                HarnessError::Unavailable(
                    "no openssl command: install the Debian package openssl".into(),
                )
            } else {
                HarnessError::io("running openssl", e)
            }
        })?;
    if !out.status.success() {
        return Err(HarnessError::Start(format!(
            "openssl {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(())
}

fn write(dir: &Path, name: &str, text: &str) -> Result<(), HarnessError> {
    std::fs::write(dir.join(name), text).map_err(|e| HarnessError::io(format!("writing {name}"), e))
}

fn new_key(dir: &Path, name: &str) -> Result<(), HarnessError> {
    openssl(
        dir,
        &[
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
            &format!("{name}.key"),
        ],
    )
}

/// A new key `NAME.key`, the extensions file `NAME.ext`, and a request `NAME.csr` for
/// common name `cn`.
fn key_and_request(dir: &Path, name: &str, cn: &str, ext: &str) -> Result<(), HarnessError> {
    new_key(dir, name)?;
    write(dir, &format!("{name}.ext"), ext)?;
    openssl(
        dir,
        &[
            "req",
            "-new",
            "-key",
            &format!("{name}.key"),
            "-subj",
            &format!("/CN={cn}"),
            "-out",
            &format!("{name}.csr"),
        ],
    )
}

fn make_ca(dir: &Path, name: &str, cn: &str, ext: &str) -> Result<(), HarnessError> {
    key_and_request(dir, name, cn, ext)?;
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-signkey",
            &format!("{name}.key"),
            "-days",
            "2",
            "-extfile",
            &format!("{name}.ext"),
            "-out",
            &format!("{name}.pem"),
        ],
    )
}

fn make_leaf(dir: &Path, name: &str, cn: &str, ca: &str, ext: &str) -> Result<(), HarnessError> {
    key_and_request(dir, name, cn, ext)?;
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}.key"),
            "-set_serial",
            &format!("{}", fastrand_serial()),
            "-days",
            "2",
            "-extfile",
            &format!("{name}.ext"),
            "-out",
            &format!("{name}.pem"),
        ],
    )
}

/// A serial number unique enough for a test CA.
fn fastrand_serial() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    (nanos as u64) & 0x7fff_ffff_ffff
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn makes_a_chain_openssl_verifies() {
        let certs = TestCerts::generate().unwrap_or_else(|e| panic!("{e}"));
        let verify = |ca: &Path, cert: &Path| {
            Command::new("openssl")
                .arg("verify")
                .arg("-CAfile")
                .arg(ca)
                .arg(cert)
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false)
        };
        assert!(verify(&certs.ca, &certs.server_cert));
        assert!(verify(&certs.ca, &certs.client_cert));
        assert!(!verify(&certs.ca, &certs.stranger_cert));
        assert!(verify(&certs.other_ca, &certs.stranger_cert));
    }
}
