//! A VFS for the writer's connection that hands each commit's WAL frames to
//! the kernel in a few `pwrite`s rather than two per frame.
//!
//! SQLite writes a WAL frame as two writes (its 24-byte header, then the
//! page), and a commit of a group of creates is 35–40 frames: 70–80 system
//! calls before its `fsync`. On this project's machines each call costs
//! ~0.8 µs of CPU besides copying its bytes, a third of such a commit's CPU
//! with the sync (see BENCHMARKS.md). This VFS is the system's default one
//! (`unix`) with the WAL file wrapped: writes that continue one another are
//! gathered in memory and written together (in pieces of at most 128 KB,
//! the most the `unix` VFS writes at once) when anything else is asked of
//! the file (its sync above all, also a read, its size, a truncation, a file
//! control, closing it), or when a megabyte has gathered. A write that does
//! not continue the gathered ones writes them first.
//!
//! **Why this keeps every guarantee.** What SQLite asks of a write is only
//! that a later read of the same file sees it (here: every read of the
//! file writes what is gathered first), and that a sync makes it durable
//! (here: the sync writes first). Other connections read the WAL through
//! their own file, but only frames of committed transactions, and a commit
//! is made visible (its wal-index header written) only after its frames
//! are synced, **provided** the connection syncs at commit, that is
//! `synchronous = FULL` and no padding written after the sync. So:
//! - [`Store`](crate::store::Store) opens only its writer with this VFS and
//!   checks that the writer's `synchronous` is `FULL`;
//! - the writer does not spill (`cache_spill = OFF`): frames written before
//!   a commit and left gathered by a rollback would be written later, over
//!   whatever another process committed at those offsets meanwhile;
//! - a WAL file whose device does not promise `POWERSAFE_OVERWRITE` (when
//!   SQLite would pad a commit to a sector past its sync) gets no gathering:
//!   its writes go straight through.
//!
//! A crash loses what is gathered exactly as it would lose a write the
//! kernel had not yet been given: SQLite's recovery ignores frames after
//! the last whole commit. Every other file (the database, its shared
//! memory, journals) is the `unix` VFS's own, untouched.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

use rusqlite::ffi;

/// The VFS's name, for `Connection::open_with_flags_and_vfs`.
pub const NAME: &CStr = c"sparring-wal-writes";

/// Gathered writes are written once they reach this many bytes (a group of
/// 64 creates writes ~1 MB; a larger commit, as a migration's, is written
/// in several).
const GATHER_LIMIT: usize = 1 << 20;

/// The most the `unix` VFS writes in one call (it masks a write's length
/// with `0x1ffff`), so the gathered bytes are written in pieces of at most
/// this: one or two for a group of the mix's creates, one for a lone write.
const MAX_WRITE: usize = 0x1ffff;

/// Registers the VFS (once per process) and returns its name.
pub fn register() -> &'static CStr {
    UNIX.get_or_init(|| {
        // SAFETY: `sqlite3_vfs_find(NULL)` returns the default VFS, which
        // SQLite never frees. The new VFS is leaked, so it outlives every
        // connection; registering is thread-safe in SQLite.
        unsafe {
            let unix = ffi::sqlite3_vfs_find(std::ptr::null());
            assert!(!unix.is_null(), "SQLite has no default VFS");
            let mut vfs = *unix;
            vfs.zName = NAME.as_ptr();
            vfs.pNext = std::ptr::null_mut();
            vfs.szOsFile = c_int::try_from(std::mem::size_of::<WalFile>()).expect("small") + (*unix).szOsFile;
            vfs.xOpen = Some(open);
            let rc = ffi::sqlite3_vfs_register(Box::into_raw(Box::new(vfs)), 0);
            assert_eq!(rc, ffi::SQLITE_OK, "registering the {NAME:?} VFS");
            Vfs(unix)
        }
    });
    NAME
}

/// The default VFS this one wraps, set once this one is registered.
struct Vfs(*mut ffi::sqlite3_vfs);
// SAFETY: SQLite's VFS objects are immutable once registered and may be used
// from any thread.
unsafe impl Send for Vfs {}
unsafe impl Sync for Vfs {}
static UNIX: OnceLock<Vfs> = OnceLock::new();

/// A WAL file: SQLite's handle (first, as SQLite requires), the writes
/// gathered, then the `unix` VFS's own handle for the file.
#[repr(C)]
struct WalFile {
    base: ffi::sqlite3_file,
    gathered: Gathered,
    /// The file's path, for [`full_disk`].
    #[cfg(test)]
    path: String,
}

struct Gathered {
    /// Whether to gather at all (see the module doc).
    on: bool,
    /// The file offset of `bytes[0]`.
    at: i64,
    bytes: Vec<u8>,
}

impl WalFile {
    /// The `unix` VFS's handle, placed right after this struct (SQLite
    /// allocates `szOsFile` bytes, 8-aligned, for each file).
    fn real(this: *mut ffi::sqlite3_file) -> *mut ffi::sqlite3_file {
        // SAFETY: `this` was opened by `open` as a `WalFile`, whose
        // allocation holds the real handle right after it.
        unsafe { (this as *mut u8).add(std::mem::size_of::<WalFile>()) as *mut ffi::sqlite3_file }
    }

    /// Writes `amount` bytes at `data` with the real file's own `xWrite`.
    ///
    /// # Safety
    /// `this` must be an open `WalFile`, `data` valid for `amount` bytes.
    unsafe fn write_through(this: *mut ffi::sqlite3_file, data: *const c_void, amount: c_int, offset: i64) -> c_int {
        #[cfg(test)]
        tests::REAL_WRITES.with(|n| n.set(n.get() + 1));
        #[cfg(test)]
        // SAFETY: per the contract.
        if let Some(rc) = full_disk::failure(unsafe { &(*(this as *mut WalFile)).path }) {
            return rc;
        }
        let real = WalFile::real(this);
        // SAFETY: per the contract.
        unsafe { ((*(*real).pMethods).xWrite.expect("unix xWrite"))(real, data, amount, offset) }
    }

    /// Writes what is gathered, if anything.
    ///
    /// # Safety
    /// `this` must be an open `WalFile`.
    unsafe fn flush(this: *mut ffi::sqlite3_file) -> c_int {
        // SAFETY: per the contract, and SQLite uses a file from one thread
        // at a time.
        let gathered = unsafe { &mut (*(this as *mut WalFile)).gathered };
        if gathered.bytes.is_empty() {
            return ffi::SQLITE_OK;
        }
        let mut rc = ffi::SQLITE_OK;
        for (i, chunk) in gathered.bytes.chunks(MAX_WRITE).enumerate() {
            // SAFETY: `chunk` is valid for its length, which fits a `c_int`.
            rc = unsafe {
                WalFile::write_through(
                    this,
                    chunk.as_ptr().cast(),
                    chunk.len() as c_int,
                    gathered.at + (i * MAX_WRITE) as i64,
                )
            };
            if rc != ffi::SQLITE_OK {
                break;
            }
        }
        // Written or failed, the bytes are no longer ours to write: a
        // failure fails the transaction, and SQLite writes its frames anew.
        gathered.bytes.clear();
        rc
    }
}

/// Calls the real file's method after writing what is gathered.
macro_rules! after_flush {
    ($name:ident, $method:ident ( $($arg:ident : $ty:ty),* ) -> c_int) => {
        unsafe extern "C" fn $name(this: *mut ffi::sqlite3_file $(, $arg: $ty)*) -> c_int {
            // SAFETY: SQLite calls these only on a file `open` opened.
            unsafe {
                let rc = WalFile::flush(this);
                if rc != ffi::SQLITE_OK {
                    return rc;
                }
                let real = WalFile::real(this);
                ((*(*real).pMethods).$method.expect(stringify!($method)))(real $(, $arg)*)
            }
        }
    };
}

/// Calls the real file's method as it is.
macro_rules! through {
    ($name:ident, $method:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty) => {
        unsafe extern "C" fn $name(this: *mut ffi::sqlite3_file $(, $arg: $ty)*) -> $ret {
            // SAFETY: SQLite calls these only on a file `open` opened.
            unsafe {
                let real = WalFile::real(this);
                ((*(*real).pMethods).$method.expect(stringify!($method)))(real $(, $arg)*)
            }
        }
    };
}

after_flush!(read, xRead(buf: *mut c_void, amount: c_int, offset: i64) -> c_int);
after_flush!(truncate, xTruncate(size: i64) -> c_int);
after_flush!(sync, xSync(flags: c_int) -> c_int);
after_flush!(file_size, xFileSize(size: *mut i64) -> c_int);
after_flush!(file_control, xFileControl(op: c_int, arg: *mut c_void) -> c_int);
through!(lock, xLock(level: c_int) -> c_int);
through!(unlock, xUnlock(level: c_int) -> c_int);
through!(check_reserved_lock, xCheckReservedLock(out: *mut c_int) -> c_int);
through!(sector_size, xSectorSize() -> c_int);
through!(device_characteristics, xDeviceCharacteristics() -> c_int);
through!(shm_map, xShmMap(page: c_int, size: c_int, extend: c_int, out: *mut *mut c_void) -> c_int);
through!(shm_lock, xShmLock(offset: c_int, n: c_int, flags: c_int) -> c_int);
through!(shm_barrier, xShmBarrier() -> ());
through!(shm_unmap, xShmUnmap(delete: c_int) -> c_int);
through!(fetch, xFetch(offset: i64, amount: c_int, out: *mut *mut c_void) -> c_int);
through!(unfetch, xUnfetch(offset: i64, page: *mut c_void) -> c_int);

unsafe extern "C" fn write(this: *mut ffi::sqlite3_file, data: *const c_void, amount: c_int, offset: i64) -> c_int {
    // SAFETY: SQLite calls this only on a file `open` opened, with `data`
    // valid for `amount` bytes.
    unsafe {
        let gathered = &mut (*(this as *mut WalFile)).gathered;
        if !gathered.on {
            return WalFile::write_through(this, data, amount, offset);
        }
        if !gathered.bytes.is_empty() && gathered.at + gathered.bytes.len() as i64 != offset {
            let rc = WalFile::flush(this);
            if rc != ffi::SQLITE_OK {
                return rc;
            }
        }
        if gathered.bytes.is_empty() {
            gathered.at = offset;
        }
        let Ok(amount) = usize::try_from(amount) else {
            return ffi::SQLITE_IOERR_WRITE;
        };
        gathered.bytes.extend_from_slice(std::slice::from_raw_parts(data.cast::<u8>(), amount));
        if gathered.bytes.len() >= GATHER_LIMIT {
            return WalFile::flush(this);
        }
        ffi::SQLITE_OK
    }
}

unsafe extern "C" fn close(this: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: SQLite closes a file `open` opened once, and never uses it
    // after.
    unsafe {
        let flushed = WalFile::flush(this);
        let real = WalFile::real(this);
        let closed = ((*(*real).pMethods).xClose.expect("xClose"))(real);
        // What the `WalFile` owns (its gathered bytes; in tests its path);
        // SQLite frees the allocation itself.
        std::ptr::drop_in_place(this as *mut WalFile);
        if flushed != ffi::SQLITE_OK {
            flushed
        } else {
            closed
        }
    }
}

static METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(close),
    xRead: Some(read),
    xWrite: Some(write),
    xTruncate: Some(truncate),
    xSync: Some(sync),
    xFileSize: Some(file_size),
    xLock: Some(lock),
    xUnlock: Some(unlock),
    xCheckReservedLock: Some(check_reserved_lock),
    xFileControl: Some(file_control),
    xSectorSize: Some(sector_size),
    xDeviceCharacteristics: Some(device_characteristics),
    xShmMap: Some(shm_map),
    xShmLock: Some(shm_lock),
    xShmBarrier: Some(shm_barrier),
    xShmUnmap: Some(shm_unmap),
    xFetch: Some(fetch),
    xUnfetch: Some(unfetch),
};

unsafe extern "C" fn open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let unix = UNIX.get().expect("registered").0;
    // SAFETY: `file` is `szOsFile` bytes, ours: a `WalFile` and the real
    // handle after it. Files other than a WAL are the real handle alone, at
    // its start.
    unsafe {
        let unix_open = (*unix).xOpen.expect("unix xOpen");
        if flags & ffi::SQLITE_OPEN_WAL == 0 {
            return unix_open(unix, name, file, flags, out_flags);
        }
        let real = WalFile::real(file);
        (*real).pMethods = std::ptr::null();
        let rc = unix_open(unix, name, real, flags, out_flags);
        if rc != ffi::SQLITE_OK {
            if !(*real).pMethods.is_null() {
                ((*(*real).pMethods).xClose.expect("xClose"))(real);
            }
            (*file).pMethods = std::ptr::null();
            return rc;
        }
        let characteristics = ((*(*real).pMethods).xDeviceCharacteristics.expect("xDeviceCharacteristics"))(real);
        std::ptr::write(
            file as *mut WalFile,
            WalFile {
                base: ffi::sqlite3_file { pMethods: &METHODS },
                gathered: Gathered {
                    on: characteristics & ffi::SQLITE_IOCAP_POWERSAFE_OVERWRITE != 0,
                    at: 0,
                    bytes: Vec::new(),
                },
                #[cfg(test)]
                path: CStr::from_ptr(name).to_string_lossy().into_owned(),
            },
        );
        ffi::SQLITE_OK
    }
}

/// For tests: a full disk under chosen WAL files, whose every write then
/// fails as the `unix` VFS fails one on a full disk (`SQLITE_FULL`), or WAL
/// files that can no longer be written (a file made read-only or immutable,
/// a file system remounted read-only, a failing disk: the `unix` VFS's
/// `SQLITE_IOERR_WRITE`).
#[cfg(test)]
pub(crate) mod full_disk {
    use std::ffi::c_int;
    use std::path::Path;
    use std::sync::Mutex;

    use rusqlite::ffi;

    static FAILING: Mutex<Vec<(String, c_int)>> = Mutex::new(Vec::new());

    fn fail(db: &Path, with: Option<c_int>) {
        let wal = format!("{}-wal", db.display());
        let mut paths = FAILING.lock().unwrap();
        paths.retain(|(p, _)| *p != wal);
        if let Some(rc) = with {
            paths.push((wal, rc));
        }
    }

    /// Fills (or, `full` false, frees) the disk under the WAL of the
    /// database at `db`.
    pub fn set(db: &Path, full: bool) {
        fail(db, full.then_some(ffi::SQLITE_FULL));
    }

    /// Makes the WAL of the database at `db` unwritable (or, `unwritable`
    /// false, writable again).
    pub fn set_unwritable(db: &Path, unwritable: bool) {
        fail(db, unwritable.then_some(ffi::SQLITE_IOERR_WRITE));
    }

    /// What a write to `wal` fails with, if it fails.
    pub(super) fn failure(wal: &str) -> Option<c_int> {
        FAILING.lock().unwrap().iter().find(|(p, _)| p == wal).map(|(_, rc)| *rc)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::path::Path;

    use rusqlite::{params, Connection, OpenFlags};

    thread_local! {
        /// Writes handed to the `unix` VFS's WAL files on this thread.
        pub(super) static REAL_WRITES: Cell<usize> = const { Cell::new(0) };
    }

    fn writer(path: &Path) -> Connection {
        let conn = Connection::open_with_flags_and_vfs(path, OpenFlags::default(), super::register()).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        conn.pragma_update(None, "synchronous", "FULL").unwrap();
        conn.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
        conn.execute_batch("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, body BLOB NOT NULL)").unwrap();
        conn
    }

    /// Bytes that differ by row and position, so a page written to the
    /// wrong place cannot read back equal.
    fn body(id: i64, len: usize) -> Vec<u8> {
        (0..len).map(|i| (i as i64 * 31 + id * 7919) as u8).collect()
    }

    /// Each row reads back as written, and the database is whole.
    fn check(reader: &Connection, rows: impl IntoIterator<Item = (i64, Vec<u8>)>) {
        for (id, want) in rows {
            let got: Vec<u8> = reader.query_row("SELECT body FROM t WHERE id = ?", [id], |r| r.get(0)).unwrap();
            assert!(got == want, "row {id} reads back different");
        }
        let ok: String = reader.query_row("PRAGMA integrity_check", [], |r| r.get(0)).unwrap();
        assert_eq!(ok, "ok");
    }

    #[test]
    fn a_commit_reaches_the_wal_in_a_few_writes_and_is_read_whole_by_another_connection() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        let mut w = writer(&path);
        // A reader on the default VFS, as the store's readers are.
        let reader = Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        let mut rows = Vec::new();
        for round in 0..20i64 {
            let before = REAL_WRITES.with(Cell::get);
            let tx = w.transaction().unwrap();
            // 40 rows of 3,000 bytes: ~40 pages, ~165 KB of frames, so
            // more than one of the unix VFS's writes.
            for i in 0..40 {
                let id = round * 100 + i;
                tx.execute("INSERT INTO t (id, body) VALUES (?, ?)", params![id, body(id, 3000)]).unwrap();
                rows.push((id, 3000));
            }
            tx.commit().unwrap();
            let writes = REAL_WRITES.with(Cell::get) - before;
            // SQLite alone would write each frame's header and page apart:
            // 80 or more writes.
            assert!((1..=4).contains(&writes), "a commit of ~40 frames took {writes} writes");
            // Visible, whole, to a connection that reads the WAL itself.
            check(&reader, rows.iter().map(|&(id, len)| (id, body(id, len))));
        }
    }

    #[test]
    fn a_transaction_that_spills_reads_and_rewrites_its_own_frames() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        let mut w = writer(&path);
        // A page cache of 10 pages: the transaction below writes frames to
        // the WAL before its commit, reads some of them back, and writes
        // some again in place (the writes that do not continue the ones
        // gathered).
        w.pragma_update(None, "cache_size", 10).unwrap();
        let tx = w.transaction().unwrap();
        for id in 0..300i64 {
            tx.execute("INSERT INTO t (id, body) VALUES (?, ?)", params![id, body(id, 1500)]).unwrap();
        }
        for id in (0..300i64).step_by(3) {
            tx.execute("UPDATE t SET body = ? WHERE id = ?", params![body(id + 1000, 1500), id]).unwrap();
        }
        // Read back inside the transaction: pages only in the WAL.
        let n: i64 = tx.query_row("SELECT count(*) FROM t", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 300);
        tx.commit().unwrap();
        drop(w);
        let reader = Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        check(&reader, (0..300i64).map(|id| (id, if id % 3 == 0 { body(id + 1000, 1500) } else { body(id, 1500) })));
    }

    #[test]
    fn a_commit_larger_than_what_is_gathered_and_a_restarted_wal_read_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        let w = writer(&path);
        // 3 MB in one commit: written as the megabyte limit is reached, in
        // pieces the unix VFS accepts.
        w.execute("INSERT INTO t (id, body) VALUES (1, ?)", [body(1, 3 << 20)]).unwrap();
        // Copy the WAL back and start it over: the next commit writes the
        // WAL's header at its start again.
        w.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())).unwrap();
        w.execute("INSERT INTO t (id, body) VALUES (2, ?)", [body(2, 10_000)]).unwrap();
        let reader = Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        check(&reader, [(1, body(1, 3 << 20)), (2, body(2, 10_000))]);
        drop(reader);
        // And after the writer is gone, from the WAL alone.
        drop(w);
        let reader = Connection::open(&path).unwrap();
        check(&reader, [(1, body(1, 3 << 20)), (2, body(2, 10_000))]);
    }
}
