//! Items shared out to scoped worker threads that each keep their own state (an `Env`, an
//! agent): the one work queue of certification campaigns, experiment episodes, study
//! warm-ups and evaluations, and the exploit check.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Run `work` on every item of `items` on up to `workers` threads (scoped, so items and
/// closures may borrow). Each thread first makes its state with `init(worker)`, then takes
/// the next untaken item until none is left: a slow item holds up only its own thread.
///
/// Returns the results in item order. An error, from `init` or `work`, or a panic stops
/// every thread before its next item; the run then returns an error: that of the
/// lowest-numbered thread that failed, `panicked()` for a thread that panicked (its items
/// have no result, so the run has none either).
pub fn run<T, S, R, E>(
    items: &[T],
    workers: usize,
    init: impl Fn(usize) -> Result<S, E> + Sync,
    work: impl Fn(&mut S, usize, &T) -> Result<R, E> + Sync,
    panicked: impl Fn() -> E,
) -> Result<Vec<R>, E>
where
    T: Sync,
    R: Send,
    E: Send,
{
    if items.is_empty() {
        return Ok(Vec::new());
    }
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let (init, work, next, stop) = (&init, &work, &next, &stop);
    let outs: Vec<Result<Vec<(usize, R)>, E>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers.clamp(1, items.len()))
            .map(|w| {
                s.spawn(move || {
                    let _guard = StopOnPanic(stop);
                    let fail = |e| {
                        stop.store(true, Ordering::Relaxed);
                        Err(e)
                    };
                    let mut state = match init(w) {
                        Ok(s) => s,
                        Err(e) => return fail(e),
                    };
                    let mut done = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(item) = items.get(i) else {
                            break;
                        };
                        match work(&mut state, i, item) {
                            Ok(r) => done.push((i, r)),
                            Err(e) => return fail(e),
                        }
                    }
                    Ok(done)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(panicked())))
            .collect()
    });
    let mut slots: Vec<Option<R>> = std::iter::repeat_with(|| None).take(items.len()).collect();
    for out in outs {
        for (i, r) in out? {
            slots[i] = Some(r);
        }
    }
    // Without an error every item was taken and finished.
    slots
        .into_iter()
        .collect::<Option<Vec<R>>>()
        .ok_or_else(panicked)
}

/// Stops the queue when its thread unwinds from a panic.
struct StopOnPanic<'a>(&'a AtomicBool);

impl Drop for StopOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn results_come_in_item_order_with_each_worker_keeping_its_state() {
        let items: Vec<u64> = (0..100).collect();
        let inits = Mutex::new(Vec::new());
        let out = run(
            &items,
            4,
            |w| {
                inits.lock().unwrap().push(w);
                Ok::<_, String>(0u64)
            },
            |seen, i, &x| {
                *seen += 1;
                // Uneven items, so that threads interleave.
                std::thread::sleep(std::time::Duration::from_micros(x % 7 * 50));
                Ok((i, x * 2, *seen))
            },
            || "panicked".to_string(),
        )
        .unwrap();
        assert_eq!(out.len(), 100);
        for (k, (i, x2, _)) in out.iter().enumerate() {
            assert_eq!((*i, *x2), (k, items[k] * 2));
        }
        // Every thread made its state once; the per-thread counts add up to the items.
        let mut inits = inits.into_inner().unwrap();
        inits.sort();
        assert_eq!(inits, vec![0, 1, 2, 3]);
        // The state lives as long as its thread, not an item: each thread's count starts at 1
        // once, so at most 4 items see a count of 1.
        let firsts = out.iter().filter(|r| r.2 == 1).count();
        assert!(
            (1..=4).contains(&firsts),
            "{firsts} items saw a fresh state"
        );
    }

    #[test]
    fn the_first_error_stops_the_queue_and_a_panic_is_an_error() {
        let items: Vec<u32> = (0..1000).collect();
        let taken = AtomicUsize::new(0);
        let r = run(
            &items,
            2,
            |_| Ok(()),
            |_, _, &x| {
                taken.fetch_add(1, Ordering::Relaxed);
                if x == 10 {
                    Err(format!("item {x}"))
                } else {
                    Ok(x)
                }
            },
            || "panicked".to_string(),
        );
        assert_eq!(r.unwrap_err(), "item 10");
        // The other thread stops before its next item: it may finish the one it holds, and
        // under preemption take a few more before it sees the flag, never the whole queue.
        assert!(taken.load(Ordering::Relaxed) < 1000, "the queue went on");
        let r = run(
            &items[..8],
            2,
            |_| Ok(()),
            |_, _, &x| {
                if x == 3 {
                    panic!("a bug");
                }
                Ok::<_, String>(x)
            },
            || "panicked".to_string(),
        );
        assert_eq!(r.unwrap_err(), "panicked");
        let r = run(
            &items[..8],
            2,
            |w| if w == 1 { Err("no env") } else { Ok(()) },
            |_, _, &x| Ok(x),
            || "panicked",
        );
        assert_eq!(r.unwrap_err(), "no env");
        assert_eq!(
            run(
                &[] as &[u32],
                4,
                |_| Err::<(), _>("never"),
                |_, _, &x| Ok(x),
                || "p"
            )
            .unwrap(),
            Vec::<u32>::new()
        );
    }
}
