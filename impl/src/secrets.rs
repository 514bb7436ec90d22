//! Secrets at rest: integration credentials, channel header values, webhook
//! secrets.
//!
//! They are sealed with XChaCha20-Poly1305 under the server's secret key,
//! with the row they belong to as associated data (a sealed value copied to
//! another row does not open). The key is 32 random bytes in
//! `<data dir>/secret.key` (created on first start, mode 0600) or the file
//! given by `--secret-key-file`. Each sealed value starts with a version byte
//! and the id of the key that sealed it, so `sparring admin
//! rotate-secret-key` can re-seal everything under a new key in one
//! transaction and a crash halfway leaves every value readable (the previous
//! key is kept as `secret.key.previous` until the rotation has committed).

use std::io::Write as _;
use std::path::{Path, PathBuf};

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use rand::RngCore as _;

pub const KEY_FILE: &str = "secret.key";
const VERSION: u8 = 1;
const KEY_ID_LEN: usize = 8;
const NONCE_LEN: usize = 24;

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("secret key file {path}: {problem}")]
    KeyFile { path: PathBuf, problem: String },
    #[error("a stored secret cannot be opened: {0}")]
    Open(&'static str),
}

struct Key {
    id: [u8; KEY_ID_LEN],
    cipher: XChaCha20Poly1305,
}

impl Key {
    fn new(bytes: &[u8; 32]) -> Key {
        let mut id = [0u8; KEY_ID_LEN];
        id.copy_from_slice(&blake3::derive_key("sparring secret key id v1", bytes)[..KEY_ID_LEN]);
        Key { id, cipher: XChaCha20Poly1305::new(bytes.into()) }
    }
}

/// The server's secret keys: the current one seals, any of them opens.
pub struct Secrets {
    current: Key,
    others: Vec<Key>,
}

impl Secrets {
    /// Loads the key from `path`, creating it (mode 0600) if it does not
    /// exist yet; also loads a previous key left by an unfinished rotation.
    pub fn load_or_create(path: &Path) -> Result<Secrets, SecretError> {
        let key_err = |problem: String| SecretError::KeyFile { path: path.to_path_buf(), problem };
        if !path.exists() {
            let mut bytes = [0u8; 32];
            rand::rng().fill_bytes(&mut bytes);
            write_key_file(path, &bytes).map_err(|e| key_err(e.to_string()))?;
        }
        let current = read_key_file(path).map_err(key_err)?;
        let others = read_previous(path)?.iter().map(Key::new).collect();
        Ok(Secrets { current: Key::new(&current), others })
    }

    /// The keys that the key file at `path` and its `.previous` held when
    /// they were read as `current` and `previous` (their contents); nothing
    /// is read or created. An error names the file whose content is not a
    /// key.
    pub fn from_contents(path: &Path, current: &[u8], previous: Option<&[u8]>) -> Result<Secrets, SecretError> {
        let current =
            parse_key_text(current).map_err(|problem| SecretError::KeyFile { path: path.to_path_buf(), problem })?;
        let others = match previous {
            None => Vec::new(),
            Some(text) => {
                parse_previous(text).map_err(|problem| SecretError::KeyFile { path: previous_path(path), problem })?
            }
        };
        Ok(Secrets { current: Key::new(&current), others: others.iter().map(Key::new).collect() })
    }

    #[cfg(test)]
    fn from_bytes(current: [u8; 32], others: &[[u8; 32]]) -> Secrets {
        Secrets { current: Key::new(&current), others: others.iter().map(Key::new).collect() }
    }

    /// Seals `plaintext`, bound to `context` (which row and field it is).
    pub fn seal(&self, plaintext: &[u8], context: &str) -> Vec<u8> {
        let mut nonce = [0u8; NONCE_LEN];
        rand::rng().fill_bytes(&mut nonce);
        let sealed = self
            .current
            .cipher
            .encrypt(XNonce::from_slice(&nonce), Payload { msg: plaintext, aad: context.as_bytes() })
            .expect("XChaCha20-Poly1305 encryption does not fail for in-memory buffers");
        let mut out = Vec::with_capacity(1 + KEY_ID_LEN + NONCE_LEN + sealed.len());
        out.push(VERSION);
        out.extend_from_slice(&self.current.id);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        out
    }

    pub fn open(&self, sealed: &[u8], context: &str) -> Result<Vec<u8>, SecretError> {
        if sealed.len() < 1 + KEY_ID_LEN + NONCE_LEN || sealed[0] != VERSION {
            return Err(SecretError::Open("unknown format"));
        }
        let id = &sealed[1..1 + KEY_ID_LEN];
        let key = std::iter::once(&self.current)
            .chain(&self.others)
            .find(|k| k.id == id)
            .ok_or(SecretError::Open("sealed with a key this server does not have"))?;
        let nonce = XNonce::from_slice(&sealed[1 + KEY_ID_LEN..1 + KEY_ID_LEN + NONCE_LEN]);
        key.cipher
            .decrypt(nonce, Payload { msg: &sealed[1 + KEY_ID_LEN + NONCE_LEN..], aad: context.as_bytes() })
            .map_err(|_| SecretError::Open("tampered with, or moved from another row"))
    }

    /// Whether `sealed` was sealed with the current key.
    pub fn is_current(&self, sealed: &[u8]) -> bool {
        sealed.len() > KEY_ID_LEN && sealed[1..1 + KEY_ID_LEN] == self.current.id
    }
}

pub fn previous_path(path: &Path) -> PathBuf {
    path.with_extension("key.previous")
}

fn read_key_file(path: &Path) -> Result<[u8; 32], String> {
    parse_key_text(&std::fs::read(path).map_err(|e| e.to_string())?)
}

/// A key file's content: one key.
fn parse_key_text(bytes: &[u8]) -> Result<[u8; 32], String> {
    let text = std::str::from_utf8(bytes).map_err(|e| e.to_string())?;
    parse_key(text.trim())
}

/// A `.previous` file's content: one key per line.
fn parse_previous(bytes: &[u8]) -> Result<Vec<[u8; 32]>, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| e.to_string())?;
    text.lines().filter(|l| !l.trim().is_empty()).map(|l| parse_key(l.trim())).collect()
}

fn parse_key(hex: &str) -> Result<[u8; 32], String> {
    let bytes = hex_decode(hex).ok_or("must hold 64 hex digits (32 bytes)")?;
    bytes.try_into().map_err(|_| "must hold 64 hex digits (32 bytes)".to_string())
}

/// The keys of unfinished rotations, one per line, if any; an error names
/// the file they are in (`<key file>.previous`), not the key file.
fn read_previous(path: &Path) -> Result<Vec<[u8; 32]>, SecretError> {
    let previous = previous_path(path);
    let read = match std::fs::read(&previous) {
        Ok(bytes) => parse_previous(&bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e.to_string()),
    };
    read.map_err(|problem| SecretError::KeyFile { path: previous, problem })
}

fn hex_decode(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

/// Writes a key file readable by its owner only, atomically.
fn write_key_file(path: &Path, bytes: &[u8; 32]) -> std::io::Result<()> {
    write_keys(path, std::slice::from_ref(bytes))
}

fn write_keys(path: &Path, keys: &[[u8; 32]]) -> std::io::Result<()> {
    let tmp = path.with_extension("key.tmp");
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    let mut f = options.open(&tmp)?;
    for key in keys {
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        writeln!(f, "{hex}")?;
    }
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    // The rename is durable once the directory is: without this a power
    // loss could keep a committed re-seal but lose the key it used.
    #[cfg(unix)]
    if let Some(dir) = path.parent() {
        let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Key rotation, in the order that keeps every value readable after a crash
/// at any point: the old key is kept as `.previous`, a new key becomes
/// current, then `reseal` (one database transaction) re-seals every value;
/// only after it commits is `.previous` removed.
pub fn rotate<E>(path: &Path, reseal: impl FnOnce(&Secrets) -> Result<usize, E>) -> Result<usize, RotateError<E>> {
    let previous = previous_path(path);
    let key_err = |p: String| RotateError::Key(SecretError::KeyFile { path: path.into(), problem: p });
    let io = |e: std::io::Error| RotateError::Key(SecretError::KeyFile { path: path.into(), problem: e.to_string() });
    // Every key a stored value may still be sealed with: those of earlier
    // unfinished rotations, and the current one.
    let mut old = read_previous(path).map_err(RotateError::Key)?;
    old.push(read_key_file(path).map_err(key_err)?);
    write_keys(&previous, &old).map_err(io)?;
    let mut new = [0u8; 32];
    rand::rng().fill_bytes(&mut new);
    write_key_file(path, &new).map_err(io)?;
    let secrets = Secrets { current: Key::new(&new), others: old.iter().map(Key::new).collect() };
    let n = reseal(&secrets).map_err(RotateError::Reseal)?;
    std::fs::remove_file(&previous).map_err(io)?;
    Ok(n)
}

#[derive(Debug, thiserror::Error)]
pub enum RotateError<E> {
    #[error(transparent)]
    Key(SecretError),
    #[error("re-sealing the stored secrets failed (the previous key is kept, nothing is lost): {0}")]
    Reseal(E),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_values_open_only_in_their_context_and_hide_the_plaintext() {
        let s = Secrets::from_bytes([7; 32], &[]);
        let sealed = s.seal(b"sk-live-123", "integration:int_1:credentials");
        assert!(!sealed.windows(11).any(|w| w == b"sk-live-123"));
        assert_eq!(s.open(&sealed, "integration:int_1:credentials").unwrap(), b"sk-live-123");
        assert!(s.open(&sealed, "integration:int_2:credentials").is_err());
        let mut tampered = sealed.clone();
        *tampered.last_mut().unwrap() ^= 1;
        assert!(s.open(&tampered, "integration:int_1:credentials").is_err());
    }

    #[test]
    fn rotation_keeps_old_values_readable_until_resealed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(KEY_FILE);
        let before = Secrets::load_or_create(&path).unwrap();
        let sealed = before.seal(b"v", "c");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        }
        let resealed = rotate::<std::convert::Infallible>(&path, |s| {
            assert!(!s.is_current(&sealed));
            assert_eq!(s.open(&sealed, "c").unwrap(), b"v");
            Ok(1)
        })
        .unwrap();
        assert_eq!(resealed, 1);
        let after = Secrets::load_or_create(&path).unwrap();
        assert!(after.open(&sealed, "c").is_err(), "the old key is gone after a completed rotation");
        // A failed re-seal keeps the previous key, so old values still open.
        let sealed2 = after.seal(b"w", "c");
        let r = rotate(&path, |_| Err::<usize, _>("disk full"));
        assert!(r.is_err());
        let recovered = Secrets::load_or_create(&path).unwrap();
        assert_eq!(recovered.open(&sealed2, "c").unwrap(), b"w");
        // And a second rotation after the failed one still opens it.
        rotate::<std::convert::Infallible>(&path, |s| {
            assert_eq!(s.open(&sealed2, "c").unwrap(), b"w");
            Ok(0)
        })
        .unwrap();
    }
}
