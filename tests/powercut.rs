//! Power-cut tests on a lossy FUSE filesystem (`powercut/lossyfs.rs`): what survives a cut is
//! what was synced, data with `fsync` of the file and names with `fsync` of the directory.
//!
//! The first two tests check the filesystem itself, through the mounted path. The last test
//! checks that a panicking test leaves no mount behind.
//!
//! Needs `/dev/fuse` and root or `fusermount3`. A cut models a machine losing power, which also
//! kills every process using the files: in-process, the tests close their files and connections
//! before cutting.

#[path = "powercut/lossyfs.rs"]
mod lossyfs;

use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use lossyfs::{is_mounted, CutReport, LossyMount};

/// `fsync(2)` on a directory: makes its current entries durable.
fn sync_dir(dir: &Path) {
    File::open(dir).unwrap().sync_all().unwrap();
}

/// Creates (or truncates) `path`, writes `bytes` and fsyncs the file, not its directory.
fn write_synced(path: &Path, bytes: &[u8]) {
    let mut file = File::create(path).unwrap();
    file.write_all(bytes).unwrap();
    file.sync_all().unwrap();
}

#[test]
fn unsynced_writes_and_truncates_are_undone_at_a_cut_and_synced_bytes_survive() {
    let mount = LossyMount::new().unwrap();
    let (log, kept) = (mount.path().join("log"), mount.path().join("kept"));
    let mut log_file = File::create(&log).unwrap();
    let mut kept_file = File::create(&kept).unwrap();
    sync_dir(mount.path());

    log_file.write_all(b"synced").unwrap();
    log_file.sync_all().unwrap();
    log_file.write_all(b" then lost").unwrap(); // read back and closed, never synced
    kept_file.write_all(b"0123456789").unwrap();
    kept_file.sync_data().unwrap(); // fdatasync counts as a sync of the data
    kept_file.set_len(4).unwrap(); // a truncate, never synced
    drop((log_file, kept_file));
    assert_eq!(fs::read(&log).unwrap(), b"synced then lost");
    assert_eq!(fs::metadata(&kept).unwrap().len(), 4);

    let report = mount.cut();
    assert_eq!(fs::read(&log).unwrap(), b"synced");
    assert_eq!(fs::read(&kept).unwrap(), b"0123456789");
    assert_eq!(
        fs::metadata(&kept).unwrap().len(),
        10,
        "no size from before the cut"
    );
    let expected = CutReport {
        files_reverted: 2,
        bytes_dropped: 10 + 6,
        ..CutReport::default()
    };
    assert_eq!(report, expected);
    assert_eq!(
        mount.cut(),
        CutReport::default(),
        "a second cut has nothing to drop"
    );
    // One request per system call: the kernel caches no writes (no writeback cache).
    let counters = mount.counters();
    let calls = (counters.writes, counters.fsyncs, counters.fsyncdirs);
    assert_eq!(calls, (3, 2, 1), "{counters:?}");
}

#[test]
fn a_name_is_durable_only_once_its_directory_is_synced() {
    let mount = LossyMount::new().unwrap();
    let dir = mount.path();
    let (name, tmp) = (dir.join("state"), dir.join("state.tmp"));

    // Created and fsynced, its directory not synced: gone.
    write_synced(&name, b"v1");
    let report = mount.cut();
    assert!(!name.exists());
    assert_eq!((report.entries_reverted, report.inodes_forgotten), (1, 1));

    // The same after fsync(dir): it survives.
    write_synced(&name, b"v1");
    sync_dir(dir);
    mount.cut();
    assert_eq!(fs::read(&name).unwrap(), b"v1");

    // A rename not followed by a directory sync is undone: the old name is back.
    fs::rename(&name, dir.join("renamed")).unwrap();
    assert_eq!(mount.cut().entries_reverted, 2);
    assert_eq!(fs::read(&name).unwrap(), b"v1");
    assert!(!dir.join("renamed").exists());

    // Write-fsync-rename over the old file without a directory sync: the old file is back.
    write_synced(&tmp, b"v2");
    fs::rename(&tmp, &name).unwrap();
    assert_eq!(fs::read(&name).unwrap(), b"v2");
    let report = mount.cut();
    assert_eq!((report.entries_reverted, report.inodes_forgotten), (1, 1));
    assert_eq!(fs::read(&name).unwrap(), b"v1");
    assert!(!tmp.exists());

    // With the directory sync, the replacement is durable.
    write_synced(&tmp, b"v2");
    fs::rename(&tmp, &name).unwrap();
    sync_dir(dir);
    let durably_replaced = CutReport {
        inodes_forgotten: 1,
        ..CutReport::default()
    };
    assert_eq!(mount.cut(), durably_replaced);
    assert_eq!(fs::read(&name).unwrap(), b"v2");
    assert!(!tmp.exists());

    // An unlink not followed by a directory sync is undone too.
    fs::remove_file(&name).unwrap();
    mount.cut();
    assert_eq!(fs::read(&name).unwrap(), b"v2");

    // A synced file in a synced subdirectory whose own name is not durable: all gone.
    fs::create_dir(dir.join("sub")).unwrap();
    write_synced(&dir.join("sub/file"), b"x");
    sync_dir(&dir.join("sub"));
    mount.cut();
    assert!(!dir.join("sub").exists());
}

/// A test that panics with its mount in use leaves no mount behind: unwinding drops the
/// `LossyMount` (after the file declared after it), which unmounts. A file still open from
/// elsewhere does not keep the mount point busy: the mount is detached lazily and that file
/// is served until it is closed. (The panic message in the output is expected.)
#[test]
fn a_test_that_panics_leaves_no_mount_behind() {
    let (send, receive) = mpsc::channel::<(PathBuf, File)>();
    let outcome = std::thread::spawn(move || {
        let mount = LossyMount::new().unwrap();
        let outlives = mount.path().join("outlives");
        fs::write(&outlives, "still served").unwrap();
        send.send((mount.path().to_owned(), File::open(&outlives).unwrap()))
            .unwrap();
        let _open = File::create(mount.path().join("open")).unwrap();
        assert!(is_mounted(mount.path()));
        panic!("a test fails with its mount in use (this panic is expected)");
    })
    .join();
    assert!(outcome.is_err());
    let (path, mut outlives) = receive.recv().unwrap();
    assert!(!is_mounted(&path), "{} is still mounted", path.display());
    assert!(!path.exists(), "the mount point was not removed");
    let mut content = String::new();
    outlives.read_to_string(&mut content).unwrap();
    assert_eq!(content, "still served");
}
