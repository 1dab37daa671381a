//! The zero-sum matrix game of a tournament: the row player (protagonists) maximises the
//! payoff, the column player (adversaries) minimises it. Solved exactly as a linear program
//! by a dense tableau simplex (Bland's rule, so it cannot cycle); the solution carries its
//! duality gap, `max_i (A y)_i - min_j (x^T A)_j`, zero up to rounding for an exact solve.
//! Also the Nash-averaged scores (each player against the other side's Nash mixture) and a
//! Bradley-Terry fit of Elo ratings (a secondary summary).

use serde::Serialize;

/// A solved matrix game.
#[derive(Debug, Clone, Serialize)]
pub struct Nash {
    /// The game's value: what the row player secures, and the column player concedes.
    pub value: f64,
    /// The row player's (protagonists') mixture.
    pub rows: Vec<f64>,
    /// The column player's (adversaries') mixture.
    pub cols: Vec<f64>,
    /// `max_i (A y)_i - min_j (x^T A)_j`: how far the pair is from an equilibrium.
    pub gap: f64,
}

const EPS: f64 = 1e-12;

/// Solve the game of the payoff matrix `a` (rows x columns, finite entries). `None` for an
/// empty or ragged matrix, a non-finite entry, or more than 50 (m + n) pivots (Bland's rule
/// ends, but floating-point error could make it cycle).
pub fn solve(a: &[Vec<f64>]) -> Option<Nash> {
    let (m, n) = (a.len(), a.first().map_or(0, Vec::len));
    solve_within(a, 50 * (m + n))
}

/// [`solve`] with at most `cap` pivots.
fn solve_within(a: &[Vec<f64>], cap: usize) -> Option<Nash> {
    let m = a.len();
    let n = a.first()?.len();
    if n == 0
        || a.iter()
            .any(|r| r.len() != n || r.iter().any(|v| !v.is_finite()))
    {
        return None;
    }
    // Shift every payoff above 0, so the value is > 0 and the LP below is bounded.
    let lo = a.iter().flatten().copied().fold(f64::INFINITY, f64::min);
    let shift = 1.0 - lo;
    // The column player's LP: max sum(y') s.t. (A + shift) y' <= 1, y' >= 0; value
    // 1 / sum(y'), y = y' * value. The row mixture is its dual: the slacks' reduced costs.
    // Tableau: m rows of [A | I | 1], objective row [-1 .. | 0 .. | 0].
    let width = n + m + 1;
    let mut t = vec![vec![0.0; width]; m + 1];
    for (i, row) in a.iter().enumerate() {
        for (j, v) in row.iter().enumerate() {
            t[i][j] = v + shift;
        }
        t[i][n + i] = 1.0;
        t[i][width - 1] = 1.0;
    }
    for v in t[m].iter_mut().take(n) {
        *v = -1.0;
    }
    let mut basis: Vec<usize> = (n..n + m).collect();
    // Bland: the lowest-index column with a negative reduced cost enters.
    let mut pivots = 0;
    while let Some(enter) = (0..n + m).find(|&j| t[m][j] < -EPS) {
        pivots += 1;
        if pivots > cap {
            tracing::warn!(
                rows = m,
                cols = n,
                cap,
                "no Nash equilibrium within the pivot cap"
            );
            return None;
        }
        // The ratio test; ties to the lowest basic index.
        let mut leave: Option<(usize, f64)> = None;
        for i in 0..m {
            if t[i][enter] > EPS {
                let r = t[i][width - 1] / t[i][enter];
                let better = match leave {
                    None => true,
                    Some((l, best)) => r < best - EPS || (r <= best + EPS && basis[i] < basis[l]),
                };
                if better {
                    leave = Some((i, r));
                }
            }
        }
        // Bounded by construction (every entry of A + shift is >= 1).
        let (p, _) = leave?;
        let pivot = t[p][enter];
        for v in t[p].iter_mut() {
            *v /= pivot;
        }
        let prow = t[p].clone();
        for (i, row) in t.iter_mut().enumerate() {
            if i != p {
                let f = row[enter];
                if f.abs() > 0.0 {
                    for (v, q) in row.iter_mut().zip(&prow) {
                        *v -= f * q;
                    }
                }
            }
        }
        basis[p] = enter;
    }
    let total = t[m][width - 1];
    if total <= EPS {
        return None;
    }
    let v = 1.0 / total;
    let mut cols = vec![0.0; n];
    for (i, &b) in basis.iter().enumerate() {
        if b < n {
            cols[b] = t[i][width - 1] * v;
        }
    }
    let rows: Vec<f64> = (0..m).map(|i| (t[m][n + i] * v).max(0.0)).collect();
    let normal = |x: Vec<f64>| {
        let s: f64 = x.iter().sum();
        x.into_iter().map(|p| p / s).collect::<Vec<_>>()
    };
    let (rows, cols) = (normal(rows), normal(cols));
    let gap = row_scores(a, &cols).into_iter().fold(f64::MIN, f64::max)
        - col_scores(a, &rows).into_iter().fold(f64::MAX, f64::min);
    Some(Nash {
        value: v - shift,
        rows,
        cols,
        gap,
    })
}

/// `A y`: each row's payoff against the column mixture `y` (the rows' Nash-averaged scores
/// when `y` is the column player's Nash mixture).
pub fn row_scores(a: &[Vec<f64>], y: &[f64]) -> Vec<f64> {
    a.iter()
        .map(|r| r.iter().zip(y).map(|(v, p)| v * p).sum())
        .collect()
}

/// `x^T A`: each column's payoff against the row mixture `x`.
pub fn col_scores(a: &[Vec<f64>], x: &[f64]) -> Vec<f64> {
    let n = a.first().map_or(0, Vec::len);
    (0..n)
        .map(|j| a.iter().zip(x).map(|(r, p)| r[j] * p).sum())
        .collect()
}

/// Elo ratings (mean 1000) of rows and columns from `(wins, games)` of each cell, the row
/// winning a game with probability `1 / (1 + 10^((c - r) / 400))`: a Bradley-Terry fit by
/// damped Newton steps with a weak prior toward the mean (so a side that always wins keeps a
/// finite rating).
pub fn elo(cells: &[Vec<(usize, usize)>]) -> (Vec<f64>, Vec<f64>) {
    let m = cells.len();
    let n = cells.first().map_or(0, Vec::len);
    let (mut r, mut c) = (vec![0.0f64; m], vec![0.0f64; n]);
    let k = 10f64.ln() / 400.0;
    // The prior: a normal of sd 400 around the mean (weak: a few games outweigh it).
    let prior = 1.0 / (400.0f64 * 400.0);
    for _ in 0..500 {
        let (mut gr, mut hr) = (vec![0.0; m], vec![prior; m]);
        let (mut gc, mut hc) = (vec![0.0; n], vec![prior; n]);
        for i in 0..m {
            for j in 0..n {
                let (w, g) = cells[i][j];
                if g == 0 {
                    continue;
                }
                let p = 1.0 / (1.0 + (k * (c[j] - r[i])).exp());
                let d = k * (w as f64 - g as f64 * p);
                let h = k * k * g as f64 * p * (1.0 - p);
                gr[i] += d;
                gc[j] -= d;
                hr[i] += h;
                hc[j] += h;
            }
        }
        // Damped Newton steps, coordinate by coordinate.
        for (x, (g, h)) in r.iter_mut().zip(gr.iter().zip(&hr)) {
            *x += 0.5 * (g - prior * *x) / h;
        }
        for (x, (g, h)) in c.iter_mut().zip(gc.iter().zip(&hc)) {
            *x += 0.5 * (g - prior * *x) / h;
        }
    }
    let all: Vec<f64> = r.iter().chain(&c).copied().collect();
    let mean = all.iter().sum::<f64>() / all.len().max(1) as f64;
    (
        r.iter().map(|x| 1000.0 + x - mean).collect(),
        c.iter().map(|x| 1000.0 + x - mean).collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn matching_pennies_is_worth_a_half_with_even_mixtures() {
        let g = solve(&[vec![1.0, 0.0], vec![0.0, 1.0]]).unwrap();
        assert!(close(g.value, 0.5), "{g:?}");
        assert!(
            g.rows.iter().chain(&g.cols).all(|p| close(*p, 0.5)),
            "{g:?}"
        );
        assert!(g.gap.abs() < 1e-9);
    }

    #[test]
    fn rock_paper_scissors_is_worth_zero_with_thirds() {
        let g = solve(&[
            vec![0.0, -1.0, 1.0],
            vec![1.0, 0.0, -1.0],
            vec![-1.0, 1.0, 0.0],
        ])
        .unwrap();
        assert!(close(g.value, 0.0), "{g:?}");
        assert!(
            g.rows.iter().chain(&g.cols).all(|p| close(*p, 1.0 / 3.0)),
            "{g:?}"
        );
        assert!(g.gap.abs() < 1e-9);
    }

    #[test]
    fn a_saddle_point_is_played_pure() {
        // Row 1 secures 0.6 (its minimum); column 0 holds every row to at most 0.6.
        let a = [
            vec![0.3, 0.9, 0.5],
            vec![0.6, 0.8, 0.7],
            vec![0.1, 0.2, 0.95],
        ];
        let g = solve(&a).unwrap();
        assert!(close(g.value, 0.6), "{g:?}");
        assert!(close(g.rows[1], 1.0) && close(g.cols[0], 1.0), "{g:?}");
        // Nash-averaged: each row against the adversaries' mixture (column 0).
        assert_eq!(row_scores(&a, &g.cols), vec![0.3, 0.6, 0.1]);
    }

    #[test]
    fn degenerate_games_solve_and_the_pivot_cap_gives_up() {
        // Every entry equal (every mixture optimal) and a duplicated row and column.
        let g = solve(&vec![vec![0.5; 3]; 3]).unwrap();
        assert!(close(g.value, 0.5) && g.gap.abs() < 1e-9, "{g:?}");
        let a = [
            vec![1.0, 0.0, 0.0],
            vec![1.0, 0.0, 0.0],
            vec![0.0, 1.0, 1.0],
        ];
        let g = solve(&a).unwrap();
        assert!(close(g.value, 0.5) && g.gap.abs() < 1e-9, "{g:?}");
        // Matching pennies needs pivots: none allowed, no answer.
        let pennies = [vec![1.0, 0.0], vec![0.0, 1.0]];
        assert!(solve_within(&pennies, 0).is_none());
        assert!(solve_within(&pennies, 100).is_some());
    }

    #[test]
    fn a_non_square_game_and_bad_matrices() {
        // 2 x 3 with a dominated column: value (0.5*4+0.5*... ) checked by the gap.
        let a = [vec![3.0, 1.0, 4.0], vec![0.0, 2.0, 5.0]];
        let g = solve(&a).unwrap();
        assert!(close(g.value, 1.5), "{g:?}");
        assert!(close(g.cols[2], 0.0) && g.gap.abs() < 1e-9, "{g:?}");
        assert!(solve(&[]).is_none());
        assert!(solve(&[vec![1.0], vec![]]).is_none());
        assert!(solve(&[vec![f64::NAN]]).is_none());
    }

    #[test]
    fn elo_ranks_the_side_that_wins_more_higher() {
        // Row 0 wins 9 of 10 against the column, row 1 wins 1 of 10.
        let (r, c) = elo(&[vec![(9, 10)], vec![(1, 10)]]);
        assert!(r[0] > c[0] && c[0] > r[1], "{r:?} {c:?}");
        let all = r[0] + r[1] + c[0];
        assert!((all / 3.0 - 1000.0).abs() < 1e-6);
    }
}
