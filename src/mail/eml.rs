//! The mail directory: each email one `<key>.eml` file, on the disk before its row is `sent`.
//!
//! A batch is written in three steps, each a type of its own, so that no step can be skipped or
//! taken out of order: [`write_unsynced`] puts every email into a file that has no name yet
//! (`O_TMPFILE`), giving an [`Unsynced`] batch; [`Unsynced::sync`] makes their data durable
//! (see [`DirSync`]), giving an [`Unnamed`] one; [`Unnamed::name`] gives each its name
//! (`linkat`) and syncs the directory, so that the names are durable too. A reader never sees
//! half an email, and after a power cut a `.eml` file is whole or absent. One barrier of each
//! kind per batch, not per file.
//!
//! The first step takes no lock of the directory's, so the relay writes its next batch while
//! this one is synced and named (see [`crate::mail::transport::Transport::send_batch`]): the
//! syncs are waits for the disk, and the CPU then writes the next batch instead of idling.
//! Measured here (`cargo bench --bench email`, 20,000 emails in batches of 4,096): 35,874
//! files/s so, against 27,973 one batch after another.
//!
//! Why unnamed files: a name is a directory entry, and in a directory of 200,000 emails the
//! entries cost more than the data. An unnamed file gets one entry; a temporary name costs three
//! (its creation, and the rename's removal and insertion). On a file system without `O_TMPFILE`
//! (FUSE, NFS) each email is written under a temporary name and renamed into place instead.
//!
//! A name that exists already is an email written whole before (the relay sends a row again
//! when a crash lost its result): names are only ever given to synced data.
//!
//! Every email of a batch keeps its file open from its write to its name, so a batch may hold
//! no more emails than the process may open files: see [`files_per_batch`].

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;

/// Why an email (or a whole batch) was not written: what was being done, in which directory,
/// and the system's error. Always worth another try.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{what} in the mail directory {dir}: {error}")]
pub struct WriteError {
    what: &'static str,
    dir: String,
    error: String,
}

/// How the file transport makes a batch of emails durable before their rows are `sent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirSync {
    /// One `syncfs(2)` for the whole batch: on a local journaling file system (ext4, XFS,
    /// Btrfs, F2FS, ZFS; tmpfs and overlayfs pass it on), it writes every file's data out, as an
    /// fsync each would, for the price of one. Measured on this kind of machine with 3 KB files:
    /// about 35,000 files/s, against about 3,500/s with an fsync each.
    FileSystem,
    /// An fsync of each file: on any other file system (FUSE, NFS and the like), where syncfs
    /// may not reach the server and promises nothing.
    EachFile,
}

impl DirSync {
    /// The cheapest sync that is a full barrier on the file system `dir` is on.
    pub fn for_dir(dir: &Path) -> DirSync {
        // statfs(2) f_type magic numbers of the file systems whose syncfs is a barrier.
        const FULL_BARRIER: [u64; 8] = [
            0xEF53,      // ext2, ext3, ext4
            0x5846_5342, // XFS
            0x9123_683E, // Btrfs
            0xF2F5_2010, // F2FS
            0x2FC1_2FC1, // ZFS
            0x0102_1994, // tmpfs (nothing is durable; nothing to lose either)
            0x794C_7630, // overlayfs (syncs its upper file system)
            0x8584_58F6, // ramfs (as tmpfs)
        ];
        let kind = std::fs::File::open(dir)
            .ok()
            .and_then(|d| rustix::fs::fstatfs(&d).ok())
            .map(|s| s.f_type as u64);
        match kind {
            Some(kind) if FULL_BARRIER.contains(&kind) => DirSync::FileSystem,
            _ => DirSync::EachFile,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            DirSync::FileSystem => "one syncfs per batch",
            DirSync::EachFile => "an fsync per file",
        }
    }

    /// How a batch's emails get their names on such a file system. The file systems whose
    /// syncfs is a barrier are the local ones, which have `O_TMPFILE`; the others (FUSE, NFS)
    /// would refuse it for every batch.
    fn naming(self) -> Naming {
        match self {
            DirSync::FileSystem => Naming::Unnamed,
            DirSync::EachFile => Naming::Temporary,
        }
    }
}

/// The most emails one batch may carry: a quarter of the open files this process may have (two
/// batches are in flight at once, each holding a file per email until it is named; the other
/// half is left for connections and the database). Read when the transport is made, after
/// [`crate::open_files::raise_limit`].
pub fn files_per_batch() -> usize {
    let limit = crate::open_files::soft_limit();
    usize::try_from(limit / 4).unwrap_or(usize::MAX).max(1)
}

/// Writes `files` (`(key, message)`) as `<dir>/<key>.eml`, and returns only once they are on
/// the disk, not merely in the page cache: the relay marks a row `sent` on this `Ok`, and a
/// power cut must not take back an email the database says was sent. The three steps, one
/// after the other.
pub fn write_eml_batch(
    dir: &Path,
    files: &[(String, Vec<u8>)],
    sync: DirSync,
) -> Vec<Result<(), WriteError>> {
    match write_unsynced(dir, files, sync) {
        Ok(batch) => batch.sync_and_name(),
        Err(error) => files.iter().map(|_| Err(error.clone())).collect(),
    }
}

/// The first step: writes each email into a file of its own, without a name (nothing of the
/// batch is visible in `dir` yet). With [`DirSync::EachFile`] each file is synced as it is
/// written; with [`DirSync::FileSystem`] the data is synced by [`Unsynced::sync`]. `Err`: the
/// directory could not be made or opened, and nothing was written.
pub fn write_unsynced(
    dir: &Path,
    files: &[(String, Vec<u8>)],
    sync: DirSync,
) -> Result<Unsynced, WriteError> {
    Unsynced::write_as(dir, files, sync, sync.naming())
}

/// How an email gets its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Naming {
    /// An unnamed file, linked into place; a temporary name where the file system has none.
    Unnamed,
    /// The same, linked through its link in /proc, as on a kernel before 6.10 (which the
    /// tests take directly).
    #[cfg_attr(not(test), allow(dead_code))]
    UnnamedThroughProc,
    /// A temporary name, renamed into place (what a file system without `O_TMPFILE` gets).
    Temporary,
}

/// Where an email's data waits for its name.
enum EmailFile {
    Unnamed(std::fs::File),
    Named(std::fs::File),
}

/// A batch of emails written, their data possibly still only in the page cache: the first of
/// the three steps (see the module's documentation). Dropped, it leaves nothing behind but the
/// temporary names of a file system without unnamed files, which a later batch overwrites.
pub struct Unsynced(Batch);

/// A batch of emails written and synced, waiting for their names: the second step.
pub struct Unnamed(Batch);

struct Batch {
    dir: PathBuf,
    dir_fd: OwnedFd,
    sync: DirSync,
    naming: Naming,
    /// Each email's key and its data, or why it could not be written.
    emails: Vec<(String, Result<EmailFile, WriteError>)>,
}

fn io_error(dir: &Path, what: &'static str, e: std::io::Error) -> WriteError {
    WriteError {
        what,
        dir: dir.display().to_string(),
        error: e.to_string(),
    }
}

fn tmp_name(key: &str) -> String {
    format!(".{key}.eml.tmp")
}

impl Unsynced {
    fn write_as(
        dir: &Path,
        files: &[(String, Vec<u8>)],
        sync: DirSync,
        naming: Naming,
    ) -> Result<Unsynced, WriteError> {
        use std::io::Write;

        crate::durable::create_dir_all(dir).map_err(|e| io_error(dir, "creating it", e))?;
        let dir_fd = rustix::fs::open(
            dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io_error(dir, "opening it", e.into()))?;
        let file_mode = Mode::from_raw_mode(0o666);
        let mut unnamed_supported = naming != Naming::Temporary;
        let mut emails = Vec::with_capacity(files.len());
        for (key, bytes) in files {
            let mut write = || -> std::io::Result<EmailFile> {
                let state = match unnamed_supported
                    .then(|| {
                        rustix::fs::openat(
                            &dir_fd,
                            ".",
                            OFlags::WRONLY | OFlags::TMPFILE | OFlags::CLOEXEC,
                            file_mode,
                        )
                    })
                    .transpose()
                {
                    Ok(Some(fd)) => EmailFile::Unnamed(std::fs::File::from(fd)),
                    Err(Errno::OPNOTSUPP | Errno::ISDIR | Errno::INVAL) | Ok(None) => {
                        unnamed_supported = false;
                        let fd = rustix::fs::openat(
                            &dir_fd,
                            tmp_name(key),
                            OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC | OFlags::CLOEXEC,
                            file_mode,
                        )?;
                        EmailFile::Named(std::fs::File::from(fd))
                    }
                    Err(e) => return Err(e.into()),
                };
                let (EmailFile::Unnamed(file) | EmailFile::Named(file)) = &state;
                let mut file: &std::fs::File = file;
                file.write_all(bytes)?;
                if sync == DirSync::EachFile {
                    file.sync_data()?;
                }
                Ok(state)
            };
            let written = write().map_err(|e| io_error(dir, "writing", e));
            emails.push((key.clone(), written));
        }
        Ok(Unsynced(Batch {
            dir: dir.to_owned(),
            dir_fd,
            sync,
            naming,
            emails,
        }))
    }

    /// The second step: makes the batch's data durable. `Err`: the sync failed, and none of
    /// the batch counts as written.
    pub fn sync(self) -> Result<Unnamed, WriteError> {
        let batch = self.0;
        // With an fsync each, every file was synced as it was written.
        if batch.sync == DirSync::FileSystem && batch.emails.iter().any(|(_, w)| w.is_ok()) {
            rustix::fs::syncfs(&batch.dir_fd)
                .map_err(|e| io_error(&batch.dir, "syncing", e.into()))?;
        }
        // The relay never reads an email back: once on the disk, its pages leave the page
        // cache, and the next batch's writes take freed pages instead of growing the cache
        // until the kernel must reclaim. A hint only: what it cannot drop stays cached.
        for (_, file) in &batch.emails {
            if let Ok(EmailFile::Unnamed(file) | EmailFile::Named(file)) = file {
                let _ = rustix::fs::fadvise(file, 0, None, rustix::fs::Advice::DontNeed);
            }
        }
        Ok(Unnamed(batch))
    }

    /// The second and third steps: the results, in the order of the batch.
    pub fn sync_and_name(self) -> Vec<Result<(), WriteError>> {
        let count = self.0.emails.len();
        match self.sync() {
            Ok(batch) => batch.name(),
            Err(error) => (0..count).map(|_| Err(error.clone())).collect(),
        }
    }
}

impl Unnamed {
    /// The third step: gives each written email its name, then syncs the directory; the
    /// results are in the order of the batch.
    pub fn name(self) -> Vec<Result<(), WriteError>> {
        let Batch {
            dir,
            dir_fd,
            naming,
            emails,
            ..
        } = self.0;
        let io = |what: &'static str, e: std::io::Error| io_error(&dir, what, e);
        let mut empty_path = naming == Naming::Unnamed;
        let results: Vec<Result<(), WriteError>> = emails
            .into_iter()
            .map(|(key, written)| {
                let name = format!("{key}.eml");
                match written? {
                    EmailFile::Named(_) => {
                        rustix::fs::renameat(&dir_fd, tmp_name(&key), &dir_fd, &name)
                            .map_err(|e| io("renaming", e.into()))
                    }
                    EmailFile::Unnamed(file) => {
                        // The file itself (AT_EMPTY_PATH): Linux 6.10 and later let the process
                        // that opened it do that; before, it takes a privilege, and fails with
                        // ENOENT without it. Then the file's own link in /proc names it instead
                        // (a third slower, measured here).
                        let by_descriptor = empty_path.then(|| {
                            rustix::fs::linkat(&file, "", &dir_fd, &name, AtFlags::EMPTY_PATH)
                        });
                        let linked = match by_descriptor {
                            Some(Err(Errno::NOENT | Errno::PERM | Errno::INVAL)) | None => {
                                empty_path = false;
                                let own = format!("/proc/self/fd/{}", file.as_raw_fd());
                                rustix::fs::linkat(
                                    rustix::fs::CWD,
                                    own,
                                    &dir_fd,
                                    &name,
                                    AtFlags::SYMLINK_FOLLOW,
                                )
                            }
                            Some(result) => result,
                        };
                        match linked {
                            Ok(()) | Err(Errno::EXIST) => Ok(()),
                            Err(e) => Err(io("naming", e.into())),
                        }
                    }
                }
            })
            .collect();
        if results.iter().any(Result::is_ok) {
            // The names are entries of the directory: its own fsync makes them durable.
            if let Err(e) = rustix::fs::fsync(&dir_fd) {
                let error = io("syncing the directory", e.into());
                return results.iter().map(|_| Err(error.clone())).collect();
            }
        }
        results
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::{write_unsynced, DirSync, Naming, Unsynced};

    fn batch() -> Vec<(String, Vec<u8>)> {
        (0..5)
            .map(|i| (format!("key{i}"), format!("email {i}\r\n").into_bytes()))
            .collect()
    }

    /// The names in `dir`, sorted.
    pub(in crate::mail) fn names(dir: &std::path::Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    fn write(
        dir: &std::path::Path,
        files: &[(String, Vec<u8>)],
        sync: DirSync,
        naming: Naming,
    ) -> Vec<Result<(), super::WriteError>> {
        Unsynced::write_as(dir, files, sync, naming)
            .unwrap()
            .sync_and_name()
    }

    /// Both ways of naming leave exactly one whole file per email and nothing else: no
    /// temporary name, no unnamed file left behind.
    #[test]
    fn each_email_is_one_whole_file_under_its_own_name_whichever_way_it_is_named() {
        for naming in [
            Naming::Unnamed,
            Naming::UnnamedThroughProc,
            Naming::Temporary,
        ] {
            for sync in [DirSync::FileSystem, DirSync::EachFile] {
                let dir = tempfile::tempdir().unwrap();
                let mail = dir.path().join("mail");
                let results = write(&mail, &batch(), sync, naming);
                assert!(
                    results.iter().all(Result::is_ok),
                    "{naming:?} {sync:?}: {results:?}"
                );
                assert_eq!(
                    names(&mail),
                    (0..5).map(|i| format!("key{i}.eml")).collect::<Vec<_>>(),
                    "{naming:?} {sync:?}"
                );
                for i in 0..5 {
                    let text = std::fs::read_to_string(mail.join(format!("key{i}.eml"))).unwrap();
                    assert_eq!(text, format!("email {i}\r\n"));
                }
            }
        }
    }

    /// Until the last step an email is in no directory: a reader of the mail directory sees
    /// nothing of a batch until it is named.
    #[test]
    fn a_written_batch_is_invisible_until_it_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let mail = dir.path().join("mail");
        let unsynced = write_unsynced(&mail, &batch(), DirSync::FileSystem).unwrap();
        assert_eq!(names(&mail), Vec::<String>::new());
        let unnamed = unsynced.sync().unwrap();
        assert_eq!(names(&mail), Vec::<String>::new());
        assert!(unnamed.name().iter().all(Result::is_ok));
        assert_eq!(names(&mail).len(), 5);
    }

    /// The relay writes its next batch while the one before is synced and named: each batch
    /// ends up whole under its own names, whichever way the file system names them, and the
    /// later batch stays invisible until its own last step.
    #[test]
    fn a_batch_written_while_the_one_before_is_synced_and_named_is_whole_and_apart() {
        for sync in [DirSync::FileSystem, DirSync::EachFile] {
            let dir = tempfile::tempdir().unwrap();
            let mail = dir.path().join("mail");
            let second: Vec<(String, Vec<u8>)> = (0..5)
                .map(|i| {
                    (
                        format!("next{i}"),
                        format!("next email {i}\r\n").into_bytes(),
                    )
                })
                .collect();
            let first = write_unsynced(&mail, &batch(), sync).unwrap();
            let later = write_unsynced(&mail, &second, sync).unwrap();
            assert!(first.sync_and_name().iter().all(Result::is_ok), "{sync:?}");
            // (A file system without unnamed files shows the later batch's temporary names,
            // `.next0.eml.tmp` and so on, which no reader of `.eml` files takes for an email.)
            let emails: Vec<String> = names(&mail)
                .into_iter()
                .filter(|name| name.ends_with(".eml"))
                .collect();
            assert_eq!(
                emails,
                (0..5).map(|i| format!("key{i}.eml")).collect::<Vec<_>>(),
                "{sync:?}: only the first batch is named"
            );
            assert!(later.sync_and_name().iter().all(Result::is_ok), "{sync:?}");
            assert_eq!(names(&mail).len(), 10, "{sync:?}");
            for i in 0..5 {
                let text = std::fs::read_to_string(mail.join(format!("next{i}.eml"))).unwrap();
                assert_eq!(text, format!("next email {i}\r\n"), "{sync:?}");
            }
        }
    }

    /// A resend after a crash finds its email written: an unnamed file's name exists only once
    /// its data was synced, so the file there is whole and is kept.
    #[test]
    fn an_email_whose_name_exists_already_counts_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let mail = dir.path().join("mail");
        assert!(write(&mail, &batch(), DirSync::FileSystem, Naming::Unnamed)
            .iter()
            .all(Result::is_ok));
        let again: Vec<(String, Vec<u8>)> = batch()
            .into_iter()
            .map(|(key, _)| (key, b"sent again".to_vec()))
            .collect();
        let results = write(&mail, &again, DirSync::FileSystem, Naming::Unnamed);
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        assert_eq!(names(&mail).len(), 5);
        assert_eq!(
            std::fs::read_to_string(mail.join("key0.eml")).unwrap(),
            "email 0\r\n"
        );
    }
}
