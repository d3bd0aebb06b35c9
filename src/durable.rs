//! Durable means on the disk, not in the page cache. A new file, directory or name is durable
//! only once the directory holding it is synced too (POSIX promises nothing less: ext4 happens
//! to journal names with any fsync, other file systems do not), so sekali syncs the directory
//! after it creates the database, the mail directory, or a backup.

use std::io;
use std::path::Path;

/// Syncs the directory `dir`: the names created, renamed or removed in it are then on the disk.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Syncs the directory that holds `path` (`.` for a bare file name).
pub fn sync_parent(path: &Path) -> io::Result<()> {
    match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(parent) => sync_dir(parent),
        None => sync_dir(Path::new(".")),
    }
}

/// `create_dir_all`, with every directory it creates made durable: each new directory's parent
/// is synced once the directory exists. Nothing is synced when `dir` already exists.
pub fn create_dir_all(dir: &Path) -> io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    let mut missing = Vec::new();
    let mut next = Some(dir);
    while let Some(path) = next.filter(|p| !p.as_os_str().is_empty() && !p.is_dir()) {
        missing.push(path);
        next = path.parent();
    }
    std::fs::create_dir_all(dir)?;
    for created in missing.into_iter().rev() {
        sync_parent(created)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn creates_every_missing_level() {
        let root = std::env::temp_dir().join(format!("sekali-durable-{}", std::process::id()));
        let deep = root.join("a").join("b");
        super::create_dir_all(&deep).unwrap();
        assert!(deep.is_dir());
        super::create_dir_all(&deep).unwrap();
        std::fs::remove_dir_all(&root).unwrap();
    }
}
