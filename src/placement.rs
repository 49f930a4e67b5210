//! Where new regions go in a pool: first-fit in the free space around the regions in use
//! (the grown table and heap, a moved heap, the allocator a clean close saves).

use host_pm::{REGION_ALIGN, Region};

/// Bytes of a region holding `size` bytes: whole [`REGION_ALIGN`] units.
pub(crate) fn region_bytes(size: u64) -> u64 {
    size.div_ceil(REGION_ALIGN) * REGION_ALIGN
}

/// Places regions of `sizes` bytes (rounded up to [`REGION_ALIGN`]) first-fit in the free
/// space around the regions `used` (the pool grows where none fits).
pub(crate) fn place(used: &[Region], sizes: &[u64]) -> Vec<Region> {
    let mut taken: Vec<Region> = used.to_vec();
    sizes
        .iter()
        .map(|&size| {
            let bytes = region_bytes(size);
            taken.sort_by_key(|r| r.offset);
            let mut at = host_pm::HEADER_AREA;
            for r in &taken {
                if r.offset >= at + bytes {
                    break;
                }
                at = at.max(r.end());
            }
            let region = Region { offset: at, bytes };
            taken.push(region);
            region
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: u64 = REGION_ALIGN;

    #[test]
    fn placement_is_first_fit_around_used_regions() {
        let h = host_pm::HEADER_AREA;
        let used = [Region { offset: h, bytes: 2 * A }, Region { offset: h + 5 * A, bytes: A }];
        // A 3-region gap after the first region; the second request no longer fits there.
        let placed = place(&used, &[2 * A, 2 * A]);
        assert_eq!(placed[0], Region { offset: h + 2 * A, bytes: 2 * A });
        assert_eq!(placed[1], Region { offset: h + 6 * A, bytes: 2 * A });
        // Sizes are rounded up to whole regions.
        assert_eq!(place(&[], &[1])[0], Region { offset: h, bytes: A });
    }
}
