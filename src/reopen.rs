//! What opening does to a pool before its first batch, for an index ([`crate::GpHash::open`])
//! and for a read-only inspection alike ([`crate::inspect`], on a private view): above both
//! recovery (claims) and resize (resuming an interrupted growth).

use host_pm::Pool;

use crate::layout::Geometry;
use crate::profile::Laps;
use crate::recovery::{self, Allocator, Recovery};
use crate::resize;

/// Everything opening does to a pool before its first batch: clears the claims of
/// unacknowledged batches ([`recovery::recover`]), then completes an interrupted resize with `builder`,
/// or abandons it when it cannot complete (the old table is intact). Returns the geometry of
/// the table in charge afterwards, what was done, and the allocator.
pub(crate) fn recover_pool(
    pool: &mut Pool,
    geo: &Geometry,
    builder: resize::Builder,
) -> crate::Result<(Geometry, Recovery, Allocator)> {
    let mut laps = Laps::start("recovery");
    let (mut recovery, allocator) = recovery::recover(pool, geo)?;
    laps.lap("scan");
    if pool.header().resize.state == 0 {
        return Ok((*geo, recovery, allocator));
    }
    match resize::complete(pool, builder, geo, recovery.items, resize::Zeroed(false), None) {
        Ok(resize::Grown { geo: grown, bitmap, old_regions, imported }) => {
            // The new regions' imports are released: the engine comes later.
            drop(imported);
            pool.give_back(&old_regions);
            recovery.resumed_resize = Some(true);
            Ok((grown, recovery, Allocator::Built(bitmap)))
        }
        Err(e) => {
            if !pool.is_private() {
                log::warn!("an interrupted resize could not complete ({e}); the table keeps its size");
            }
            resize::abandon(pool)?;
            recovery.resumed_resize = Some(false);
            Ok((*geo, recovery, allocator))
        }
    }
}
