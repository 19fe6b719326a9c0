//! The resume tokens' key of a single instance (`cluster.token_key` empty): 32 random bytes in
//! `<data_dir>/resume_token.key`, made at the first start and kept, so the tokens it issued stay
//! valid across restarts (`core::resume_token` MACs with it).

use std::path::Path;

use anyhow::Context;

use crate::core::resume_token::{TokenKey, KEY_BYTES};

/// The generated key's file in the data dir.
const KEY_FILE: &str = "resume_token.key";

/// Reads `<data_dir>/resume_token.key`, or generates it (hex, written atomically and fsynced,
/// readable by the owner only).
pub fn load_or_create(data_dir: &Path) -> anyhow::Result<TokenKey> {
    let path = data_dir.join(KEY_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let bytes = decode_hex(text.trim()).filter(|b| b.len() >= KEY_BYTES);
            let bytes = bytes.with_context(|| {
                format!(
                    "{} does not hold a key of at least {KEY_BYTES} bytes in hex: remove it to make a new one (tokens issued with the old key are then refused)",
                    path.display()
                )
            })?;
            Ok(TokenKey::new(&bytes))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = TokenKey::random_bytes();
            let text: String = key.iter().map(|b| format!("{b:02x}")).collect();
            crate::durable_files::write_atomically(&path, format!("{text}\n").as_bytes()).with_context(|| format!("writing {}", path.display()))?;
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).with_context(|| format!("restricting {}", path.display()))?;
            }
            Ok(TokenKey::new(&key))
        }
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::resume_token::{Holder, ResumeToken};

    #[test]
    fn a_generated_key_is_kept_across_starts_and_a_damaged_file_stops_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create(dir.path()).unwrap();
        let text = first.issue(&ResumeToken { holder: Holder::Client("c".into()), issued_at_ms: 1, topics: Vec::new() });
        let again = load_or_create(dir.path()).unwrap();
        assert!(again.open(&text).is_ok(), "the same key after a restart");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join(KEY_FILE)).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "readable by the owner only: {mode:o}");
        }
        for damaged in ["abc\n", "zz\n", "00\n"] {
            std::fs::write(dir.path().join(KEY_FILE), damaged).unwrap();
            let e = load_or_create(dir.path()).unwrap_err().to_string();
            assert!(e.contains("does not hold a key"), "{damaged:?}: {e}");
        }
    }
}
