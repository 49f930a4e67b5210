//! Read-only inspection of a pool (`gphash check`, `gphash stats`).
//!
//! [`inspect`] opens the pool as a private copy-on-write view ([`Pool::open_private`]) that
//! never writes the file, checks the table as found, runs recovery in the view exactly as
//! [`crate::GpHash::open`] would, and checks the table recovery leaves. No GPU is opened: an
//! interrupted resize is completed by the CPU model ([`resize::Builder::Cpu`]), the same
//! algorithm as the GPU's build. Pages the view's recovery writes are copied into this
//! process's memory (a resumed resize: the whole grown table and heap).

use std::fmt;
use std::path::{Path, PathBuf};

use host_pm::{Backend, Header, Pool};

use crate::error::Result;
use crate::index::GpHash;
use crate::recovery::{self, CheckReport, Recovery};
use crate::reopen;
use crate::resize;
use crate::table_stats::TableStats;

/// What [`inspect`] found.
#[derive(Clone, Debug)]
pub struct Inspection {
    /// The pool.
    pub path: PathBuf,
    /// The header as found (the newest intact copy).
    pub header: Header,
    /// The pool's backend.
    pub backend: Backend,
    /// Pool size in bytes.
    pub pool_bytes: u64,
    /// The check of the table as found (claims are normal in a pool not closed cleanly).
    pub found: CheckReport,
    /// What recovery would do, or why it would refuse the pool.
    pub recovery: std::result::Result<Recovery, String>,
    /// The check of the table as recovery leaves it, when recovery changes it (claims cleared,
    /// a resize completed or abandoned).
    pub recovered: Option<CheckReport>,
    /// The table as recovery would leave it (as found, when recovery would refuse the pool).
    pub stats: TableStats,
}

/// Inspects the pool at `path` without writing it (see the module docs). Errors are pools
/// that cannot be checked at all: unreadable, not a pool, another format version, a damaged
/// header, a table this build cannot use, or [`host_pm::PoolError::Locked`] while a writer
/// has the pool open (its changes would be seen half-made).
pub fn inspect(path: &Path) -> Result<Inspection> {
    let mut pool = Pool::open_private(path)?;
    let geo = GpHash::geometry_of(&pool)?;
    let header = *pool.header();
    let found = recovery::check(&pool, &geo, &header);
    let (recovery, recovered, stats) = match reopen::recover_pool(&mut pool, &geo, resize::Builder::Cpu) {
        Ok((geo, rec, _)) => {
            let changed = rec.cleared_claims > 0 || rec.resumed_resize.is_some();
            let recovered = changed.then(|| recovery::check(&pool, &geo, pool.header()));
            let stats = TableStats::of(&geo, rec.items);
            (Ok(rec), recovered, stats)
        }
        Err(e) => (Err(e.to_string()), None, TableStats::of(&geo, found.items)),
    };
    Ok(Inspection {
        path: path.to_path_buf(),
        header,
        backend: pool.backend(),
        pool_bytes: pool.len(),
        found,
        recovery,
        recovered,
        stats,
    })
}

impl Inspection {
    /// Whether the pool was closed cleanly.
    pub fn clean(&self) -> bool {
        self.header.clean_shutdown
    }

    /// Violations found, as found and after recovery; a refusing recovery counts as one.
    pub fn violations(&self) -> usize {
        self.found.violations.len()
            + self.recovered.as_ref().map_or(0, |r| r.violations.len())
            + usize::from(self.recovery.is_err())
    }

    /// Whether the pool is consistent, as found and as recovery would leave it.
    pub fn consistent(&self) -> bool {
        self.violations() == 0
    }

    /// What recovery would do, as a phrase ("recovery would clear 2 claim(s) ...").
    pub fn recovery_plan(&self) -> String {
        let rec = match &self.recovery {
            Ok(rec) => rec,
            Err(why) => return format!("recovery would refuse the pool: {why}"),
        };
        let mut plan = format!("recovery would clear {} unacknowledged claim(s)", rec.cleared_claims);
        match rec.resumed_resize {
            Some(true) => plan.push_str(" and complete an interrupted resize"),
            Some(false) => plan.push_str(
                " and abandon an interrupted resize that cannot complete (the table keeps its size)",
            ),
            None => {}
        }
        plan
    }

    /// The verdict in one line: "consistent", "not closed cleanly; recovery would ...;
    /// consistent after recovery", or "INCONSISTENT: n violation(s)".
    pub fn verdict(&self) -> String {
        if !self.consistent() {
            format!("INCONSISTENT: {} violation(s)", self.violations())
        } else if self.clean() {
            "consistent".into()
        } else {
            format!("not closed cleanly; {}; consistent after recovery", self.recovery_plan())
        }
    }
}

/// A report indented by two spaces.
fn indented(report: &CheckReport) -> String {
    report.to_string().lines().map(|l| format!("  {l}\n")).collect()
}

impl fmt::Display for Inspection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = if self.clean() { "closed cleanly" } else { "NOT closed cleanly" };
        writeln!(f, "{}: {state} (header sequence {})", self.path.display(), self.header.sequence)?;
        write!(f, "the table as found:\n{}", indented(&self.found))?;
        match (&self.recovery, &self.recovered) {
            (Ok(_), Some(after)) => {
                write!(f, "{}; the table then:\n{}", self.recovery_plan(), indented(after))?
            }
            (Ok(_), None) => {}
            (Err(_), _) => writeln!(f, "{}", self.recovery_plan())?,
        }
        write!(f, "{}", self.verdict())
    }
}
