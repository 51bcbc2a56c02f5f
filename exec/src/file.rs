//! Files written whole: what the caches and calibration files on disk are written with.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Writes `bytes` to `path` so that a reader sees the old file or the whole new one, never a
/// part: into a file of this write's own beside it (`<name>.tmp<process id>-<count>`, which no
/// other thread or process writes), then renamed over `path`. On failure the temporary file
/// is removed and `path` is left as it was.
pub fn write_whole(path: &Path, bytes: &[u8]) -> io::Result<()> {
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let n = WRITES.fetch_add(1, Ordering::Relaxed);
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp{}-{n}", std::process::id()));
    let tmp = path.with_file_name(name);
    let written = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::write_whole;

    fn dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("frt-exec-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// Writers at once, each writing its own contents again and again, and a reader: every
    /// read is one writer's whole contents, and no temporary file is left.
    #[test]
    fn concurrent_writes_are_read_whole() {
        let d = dir("whole");
        let path = d.join("f.bin");
        let contents: Vec<Vec<u8>> = (0..8u8).map(|k| vec![k; 1 << 18]).collect();
        std::thread::scope(|s| {
            for c in &contents {
                let path = &path;
                s.spawn(move || {
                    for _ in 0..8 {
                        write_whole(path, c).unwrap();
                    }
                });
            }
            s.spawn(|| {
                for _ in 0..64 {
                    if let Ok(got) = std::fs::read(&path) {
                        assert_eq!(got.len(), 1 << 18, "a part of a file");
                        assert!(got.iter().all(|&b| b == got[0]), "two writes mixed");
                    }
                }
            });
        });
        let left: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, vec![std::ffi::OsString::from("f.bin")]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A write that cannot happen (its folder is missing) is an error, and leaves nothing.
    #[test]
    fn a_failed_write_leaves_nothing() {
        let d = dir("fail");
        let path = d.join("missing").join("f.bin");
        assert!(write_whole(&path, b"x").is_err());
        assert!(!path.exists());
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
