//! A throwaway certificate authority for the TLS tests: EC keys from `openssl`, valid for two
//! days, a server certificate per name it is asked for.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::require_binary;

pub struct TestCa {
    dir: tempfile::TempDir,
    openssl: PathBuf,
}

const EC: [&str; 5] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-nodes",
];

impl TestCa {
    /// A new CA (`ca.key`, `ca.crt`) in a temporary directory.
    pub fn new() -> Self {
        let ca = Self {
            dir: tempfile::tempdir().expect("tempdir"),
            openssl: require_binary("openssl"),
        };
        ca.run(
            &[
                &["req", "-x509"][..],
                &EC,
                &[
                    "-keyout",
                    "ca.key",
                    "-out",
                    "ca.crt",
                    "-days",
                    "2",
                    "-subj",
                    "/CN=distlock test CA",
                    "-addext",
                    "basicConstraints=critical,CA:TRUE",
                    "-addext",
                    "keyUsage=critical,keyCertSign,cRLSign",
                ],
            ]
            .concat(),
        );
        ca
    }

    fn run(&self, args: &[&str]) {
        let out = Command::new(&self.openssl)
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .expect("run openssl");
        assert!(
            out.status.success(),
            "openssl {args:?} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The CA certificate, PEM.
    pub fn pem(&self) -> Vec<u8> {
        std::fs::read(self.dir.path().join("ca.crt")).expect("read ca.crt")
    }

    /// The CA certificate's file.
    pub fn pem_path(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// A server certificate and key (`<name>.crt`, `<name>.key`) for the subject alternative
    /// name `san` (`IP:127.0.0.1`, `DNS:localhost`), signed by this CA.
    pub fn issue(&self, name: &str, san: &str) -> (PathBuf, PathBuf) {
        let (key, csr, crt, ext) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
            format!("{name}.ext"),
        );
        self.run(
            &[
                &["req"][..],
                &EC,
                &[
                    "-keyout",
                    &key,
                    "-out",
                    &csr,
                    "-subj",
                    &format!("/CN={name}"),
                ],
            ]
            .concat(),
        );
        std::fs::write(
            self.dir.path().join(&ext),
            format!(
                "subjectAltName={san}\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n"
            ),
        )
        .expect("write the extensions");
        self.run(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "2",
            "-extfile",
            &ext,
        ]);
        (self.dir.path().join(crt), self.dir.path().join(key))
    }
}
