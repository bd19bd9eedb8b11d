//! Key pairs that sign trees: Ed25519 and ECDSA P-256 (SHA-256), read from PEM — PKCS#8 private
//! keys (also SEC1 `EC PRIVATE KEY` for P-256, as `openssl ecparam -genkey` writes them) and
//! SubjectPublicKeyInfo public keys, the files `openssl` and Python's `cryptography` write.
//!
//! A key is named by its *fingerprint*: the SHA-256 of its public key's SubjectPublicKeyInfo PEM
//! text (LF line endings, 64-character lines), in lowercase hex. It is the `hint` the OpenSSF
//! model-signing tool writes into its bundles for the same key, so one name serves both tools.

use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey};
use p256::ecdsa::signature::{Signer as _, Verifier as _};
use sha2::Digest as _;

/// A signature algorithm treepack signs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Ed25519 (RFC 8032), signing the DSSE pre-authentication encoding directly.
    Ed25519,
    /// ECDSA over NIST P-256 with SHA-256, signatures DER-encoded (as `cryptography` writes them).
    P256,
}

impl Algorithm {
    /// The name used in files and messages: `ed25519`, `ecdsa-p256`.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Ed25519 => "ed25519",
            Algorithm::P256 => "ecdsa-p256",
        }
    }

    /// The algorithm of a name [`Algorithm::name`] gives (also `p256`, `ecdsa`).
    pub fn from_name(s: &str) -> Option<Algorithm> {
        match s.to_ascii_lowercase().as_str() {
            "ed25519" => Some(Algorithm::Ed25519),
            "ecdsa-p256" | "p256" | "p-256" | "ecdsa" | "secp256r1" => Some(Algorithm::P256),
            _ => None,
        }
    }
}

/// A private key that signs trees.
#[derive(Clone)]
pub enum SigningKey {
    /// An Ed25519 key.
    Ed25519(Box<ed25519_dalek::SigningKey>),
    /// An ECDSA P-256 key.
    P256(Box<p256::ecdsa::SigningKey>),
}

impl std::fmt::Debug for SigningKey {
    /// Never the secret: the algorithm and the public key's fingerprint.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SigningKey({} {})", self.algorithm().name(), self.verifying_key().fingerprint())
    }
}

/// A public key that checks signatures.
#[derive(Clone, PartialEq, Eq)]
pub enum VerifyingKey {
    /// An Ed25519 public key.
    Ed25519(ed25519_dalek::VerifyingKey),
    /// An ECDSA P-256 public key.
    P256(p256::ecdsa::VerifyingKey),
}

impl std::fmt::Debug for VerifyingKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VerifyingKey({} {})", self.algorithm().name(), self.fingerprint())
    }
}

/// What to say about PEM text that is not a key treepack reads.
fn unsupported(kind: &str, found: &str) -> String {
    format!(
        "not a {kind} treepack reads ({found}): use an Ed25519 or ECDSA P-256 key in PEM, e.g. from `treepack keygen \
         KEY.pem`, or `openssl genpkey -algorithm ed25519 -out KEY.pem` and `openssl pkey -in KEY.pem -pubout -out \
         KEY.pub.pem`"
    )
}

/// The label of the first PEM block in `text` (`PRIVATE KEY`, `PUBLIC KEY`, …), if any.
fn pem_label(text: &str) -> Option<&str> {
    let rest = &text[text.find("-----BEGIN ")? + 11..];
    Some(&rest[..rest.find("-----")?])
}

impl SigningKey {
    /// Read a private key from PEM text.
    ///
    /// # Errors
    /// What is wrong, for a message: not PEM, an encrypted key (decrypt it first), a public
    /// key given as a private one, another algorithm.
    pub fn from_pem(text: &str) -> Result<SigningKey, String> {
        match pem_label(text) {
            Some("PRIVATE KEY") => {}
            Some("EC PRIVATE KEY") => {
                use p256::elliptic_curve::SecretKey;
                return SecretKey::<p256::NistP256>::from_sec1_pem(text)
                    .map(|k| SigningKey::P256(Box::new(k.into())))
                    .map_err(|e| unsupported("P-256 private key", &e.to_string()));
            }
            Some("ENCRYPTED PRIVATE KEY") => {
                return Err("the private key is encrypted; treepack reads unencrypted PKCS#8 keys: decrypt it \
                            (`openssl pkcs8 -in KEY.pem -out PLAIN.pem`) and keep that file private"
                    .into())
            }
            Some("PUBLIC KEY") => return Err("this is a public key; signing needs the private key".into()),
            Some(other) => return Err(unsupported("private key", &format!("a PEM `{other}` block"))),
            None => return Err(unsupported("private key", "no PEM `BEGIN` line")),
        }
        if let Ok(k) = ed25519_dalek::SigningKey::from_pkcs8_pem(text) {
            return Ok(SigningKey::Ed25519(Box::new(k)));
        }
        p256::ecdsa::SigningKey::from_pkcs8_pem(text)
            .map(|k| SigningKey::P256(Box::new(k)))
            .map_err(|e| unsupported("private key", &format!("PKCS#8 of another algorithm or damaged: {e}")))
    }

    /// A key from 32 secret bytes (random bytes make a new key; for P-256 they must be a scalar
    /// below the group order, which random bytes are but for a chance of 2^-32).
    ///
    /// # Errors
    /// For P-256, bytes that are zero or not below the group order.
    pub fn from_secret_bytes(algorithm: Algorithm, bytes: &[u8; 32]) -> Result<SigningKey, String> {
        match algorithm {
            Algorithm::Ed25519 => Ok(SigningKey::Ed25519(Box::new(ed25519_dalek::SigningKey::from_bytes(bytes)))),
            Algorithm::P256 => p256::ecdsa::SigningKey::from_slice(bytes)
                .map(|k| SigningKey::P256(Box::new(k)))
                .map_err(|e| format!("not a P-256 secret: {e}")),
        }
    }

    /// The private key as PKCS#8 PEM (keep it private).
    ///
    /// # Errors
    /// Encoding errors (none expected).
    pub fn to_pem(&self) -> Result<String, String> {
        let pem = match self {
            // PKCS#8 v1, the secret alone (as OpenSSL writes it): OpenSSL 3 and `cryptography`
            // refuse the v2 form with the public key that ed25519-dalek writes by default.
            SigningKey::Ed25519(k) => {
                ed25519_dalek::ed25519::pkcs8::KeypairBytes { secret_key: k.to_bytes(), public_key: None }
                    .to_pkcs8_pem(LineEnding::LF)
            }
            SigningKey::P256(k) => k.to_pkcs8_pem(LineEnding::LF),
        };
        pem.map(|p| p.to_string()).map_err(|e| e.to_string())
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        match self {
            SigningKey::Ed25519(_) => Algorithm::Ed25519,
            SigningKey::P256(_) => Algorithm::P256,
        }
    }

    /// The public half.
    pub fn verifying_key(&self) -> VerifyingKey {
        match self {
            SigningKey::Ed25519(k) => VerifyingKey::Ed25519(k.verifying_key()),
            SigningKey::P256(k) => VerifyingKey::P256(*k.verifying_key()),
        }
    }

    /// Sign `message` (the DSSE pre-authentication encoding): Ed25519's 64 bytes, or ECDSA's
    /// DER encoding. Both are deterministic (RFC 8032; RFC 6979 nonces).
    pub fn sign(&self, message: &[u8]) -> Vec<u8> {
        match self {
            SigningKey::Ed25519(k) => k.sign(message).to_bytes().to_vec(),
            SigningKey::P256(k) => {
                let s: p256::ecdsa::Signature = k.sign(message);
                s.to_der().as_bytes().to_vec()
            }
        }
    }
}

impl VerifyingKey {
    /// Read a public key from SubjectPublicKeyInfo PEM text (`BEGIN PUBLIC KEY`). A private key
    /// is accepted too (its public half is used), so a signer can check with the file it has.
    ///
    /// # Errors
    /// What is wrong, for a message.
    pub fn from_pem(text: &str) -> Result<VerifyingKey, String> {
        match pem_label(text) {
            Some("PUBLIC KEY") => {}
            Some("PRIVATE KEY" | "EC PRIVATE KEY" | "ENCRYPTED PRIVATE KEY") => {
                return SigningKey::from_pem(text).map(|k| k.verifying_key())
            }
            Some(other) => return Err(unsupported("public key", &format!("a PEM `{other}` block"))),
            None => return Err(unsupported("public key", "no PEM `BEGIN` line")),
        }
        if let Ok(k) = ed25519_dalek::VerifyingKey::from_public_key_pem(text) {
            return Ok(VerifyingKey::Ed25519(k));
        }
        p256::ecdsa::VerifyingKey::from_public_key_pem(text).map(VerifyingKey::P256).map_err(|e| {
            unsupported("public key", &format!("SubjectPublicKeyInfo of another algorithm or damaged: {e}"))
        })
    }

    /// Read a public key from SubjectPublicKeyInfo DER (as a statement embeds it).
    ///
    /// # Errors
    /// What is wrong, for a message.
    pub fn from_der(der: &[u8]) -> Result<VerifyingKey, String> {
        if let Ok(k) = ed25519_dalek::VerifyingKey::from_public_key_der(der) {
            return Ok(VerifyingKey::Ed25519(k));
        }
        p256::ecdsa::VerifyingKey::from_public_key_der(der)
            .map(VerifyingKey::P256)
            .map_err(|e| format!("not an Ed25519 or P-256 public key: {e}"))
    }

    /// The SubjectPublicKeyInfo DER.
    pub fn to_der(&self) -> Vec<u8> {
        let der = match self {
            VerifyingKey::Ed25519(k) => k.to_public_key_der(),
            VerifyingKey::P256(k) => k.to_public_key_der(),
        };
        // Encoding a valid key into a fresh buffer cannot fail.
        der.map(|d| d.as_bytes().to_vec()).unwrap_or_default()
    }

    /// The SubjectPublicKeyInfo PEM, LF line endings.
    pub fn to_pem(&self) -> String {
        let pem = match self {
            VerifyingKey::Ed25519(k) => k.to_public_key_pem(LineEnding::LF),
            VerifyingKey::P256(k) => k.to_public_key_pem(LineEnding::LF),
        };
        pem.unwrap_or_default()
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        match self {
            VerifyingKey::Ed25519(_) => Algorithm::Ed25519,
            VerifyingKey::P256(_) => Algorithm::P256,
        }
    }

    /// SHA-256 of [`VerifyingKey::to_pem`], 64 lowercase hex digits (the model-signing `hint`).
    pub fn fingerprint(&self) -> String {
        let d = sha2::Sha256::digest(self.to_pem().as_bytes());
        crate::hash::Hash32(d.into()).to_hex()
    }

    /// Whether `sig` is this key's signature of `message`. Ed25519 is checked strictly (no
    /// small-order keys or non-canonical signatures); a P-256 signature is DER, or the 64-byte
    /// fixed form some tools write.
    pub fn verify(&self, message: &[u8], sig: &[u8]) -> bool {
        match self {
            VerifyingKey::Ed25519(k) => {
                ed25519_dalek::Signature::from_slice(sig).map(|s| k.verify_strict(message, &s).is_ok()).unwrap_or(false)
            }
            VerifyingKey::P256(k) => {
                let s = p256::ecdsa::Signature::from_der(sig).or_else(|_| p256::ecdsa::Signature::from_slice(sig));
                s.map(|s| k.verify(message, &s).is_ok()).unwrap_or(false)
            }
        }
    }
}
