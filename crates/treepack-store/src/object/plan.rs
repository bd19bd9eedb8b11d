//! Request planning for ranged reads of remote objects: few, bounded requests.

use std::ops::Range;

/// Ranges closer than this are fetched in one request (the bytes between are read and dropped).
pub(super) const COALESCE_GAP: u64 = 1 << 20;

/// Group ranges into requests: neighbours closer than [`COALESCE_GAP`] share a request unless it
/// would grow past `max_bytes`. Every input range lies wholly inside one request, so results are
/// zero-copy slices. Returns `(request, indices of the ranges in it)`.
pub(super) fn plan_requests(ranges: &[Range<u64>], max_bytes: u64) -> Vec<(Range<u64>, Vec<usize>)> {
    let mut order: Vec<usize> = (0..ranges.len()).collect();
    order.sort_by_key(|&i| (ranges[i].start, ranges[i].end));
    let mut out: Vec<(Range<u64>, Vec<usize>)> = vec![];
    for i in order {
        let r = &ranges[i];
        if let Some((req, members)) = out.last_mut() {
            let end = req.end.max(r.end);
            if r.start <= req.end.saturating_add(COALESCE_GAP) && end - req.start <= max_bytes {
                req.end = end;
                members.push(i);
                continue;
            }
        }
        out.push((r.clone(), vec![i]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_requests_coalesces_neighbours_and_caps_size() {
        let rs = vec![0..10, 10..20, (3 << 20)..(3 << 20) + 5, 20..30];
        let plan = plan_requests(&rs, 1 << 30);
        assert_eq!(plan.len(), 2);
        assert_eq!(plan[0].0, 0..30);
        assert_eq!(plan[0].1, vec![0, 1, 3]);
        assert_eq!(plan[1].0, (3 << 20)..(3 << 20) + 5);
        // A cap of 15 bytes splits at range boundaries, never inside a range.
        let plan = plan_requests(&rs[..2], 15);
        assert_eq!(plan.iter().map(|p| p.0.clone()).collect::<Vec<_>>(), vec![0..10, 10..20]);
    }
}
