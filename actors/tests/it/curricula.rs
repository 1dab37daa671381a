//! PAIRED, robust PLR, ACCEL and SFL on threads with fake roles: what each learns from,
//! what each scores, and what each keeps.

use crate::schedules::DIMS;
use actors::msg::{
    Acted, EpisodeOutcome, Failure, FailureKind, LearnStats, Level, Origin, Pick, Recorded, Start,
    StepResult, Transition,
};
use actors::roles::{Agent, Critic, Curriculum, EnvWorker, RoleError, Workers};
use actors::schedule::{build, Method, Phase, Roles, ScheduleConfig, UNUSABLE_REWARD};
use actors::space::LevelSpace;
use actors::testing::{
    space, AgentLog, FakeAgent, FakeCritic, FakeSynthesizer, FakeWorker, Sabotage,
};
use actors::workers::ThreadWorkers;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

type Log = Arc<Mutex<AgentLog>>;

fn fake_workers(n: usize, sabotage: &Sabotage) -> ThreadWorkers<FakeWorker> {
    let steps = Arc::new(AtomicU64::new(0));
    ThreadWorkers::new(
        (0..n)
            .map(|_| FakeWorker::new(DIMS, 3, sabotage.clone(), steps.clone()))
            .collect(),
    )
}

fn agent(seed: u64) -> (FakeAgent, Log) {
    let a = FakeAgent::new(seed, FakeWorker::actions(DIMS), 4, 0.3);
    let log = a.log.clone();
    (a, log)
}

// ---------------------------------------------------------------- PAIRED

/// A critic that must not be asked (lambda 0).
struct RefusingCritic;

impl Critic for RefusingCritic {
    fn realism(&mut self, _: &[Level]) -> Result<Vec<f64>, RoleError> {
        Err(RoleError::new("critic", "consulted with lambda 0"))
    }
    fn learn(&mut self, _: &[Level]) -> Result<LearnStats, RoleError> {
        Err(RoleError::new("critic", "trained with lambda 0"))
    }
    fn save(&self, _: &Path) -> Result<(), RoleError> {
        Ok(())
    }
}

type Scored = Arc<Mutex<Vec<(actors::msg::Proposal, f64)>>>;

struct Paired {
    roles: Roles,
    protagonist: Log,
    antagonist: Log,
    scored: Vec<Scored>,
}

fn paired(critic: Box<dyn Critic>, sabotage: Sabotage) -> Paired {
    let sp = space(DIMS, 1, 1.0, 20);
    let (p, protagonist) = agent(1);
    let (a, antagonist) = agent(2);
    let adversaries: Vec<FakeSynthesizer> = (0..2)
        .map(|k| FakeSynthesizer::new(sp.clone(), 10 + k))
        .collect();
    let scored = adversaries.iter().map(|a| a.learned.clone()).collect();
    Paired {
        roles: Roles {
            protagonist: Box::new(p),
            antagonist: Some(Box::new(a)),
            adversaries: adversaries.into_iter().map(|a| Box::new(a) as _).collect(),
            critic: Some(critic),
            curriculum: None,
            workers: Box::new(fake_workers(4, &sabotage)),
        },
        protagonist,
        antagonist,
        scored,
    }
}

/// The reward each proposal of adversary `k` should get, computed from the iteration's
/// outcomes: `(level key, reward)`, sorted.
fn expected_regrets(outcomes: &[EpisodeOutcome], k: usize, lambda: f64) -> Vec<(String, f64)> {
    let mut by_tag: BTreeMap<u64, Vec<&EpisodeOutcome>> = BTreeMap::new();
    for o in outcomes {
        if o.origin == Origin::Adversary(k) {
            by_tag.entry(o.tag.unwrap()).or_default().push(o);
        }
    }
    let mut out = Vec::new();
    for eps in by_tag.values() {
        let level = &eps[0].level;
        if eps
            .iter()
            .any(|o| o.failure.as_ref().map(|f| f.kind) == Some(FailureKind::Unusable))
        {
            out.push((level.key(), UNUSABLE_REWARD));
            continue;
        }
        let rets = |who: &str| -> Vec<f64> {
            eps.iter()
                .filter(|o| o.agent == who && o.failure.is_none())
                .map(|o| o.ret)
                .collect()
        };
        let (p, a) = (rets("protagonist"), rets("antagonist"));
        if p.is_empty() || a.is_empty() {
            continue;
        }
        let best = a.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let mean = p.iter().sum::<f64>() / p.len() as f64;
        // FakeCritic: log D = -(faults on).
        out.push((level.key(), best - mean - lambda * level.active() as f64));
    }
    sort(&mut out);
    out
}

/// What the adversary learned from since the last call: `(level key, reward)`, sorted.
fn take_scored(scored: &Scored) -> Vec<(String, f64)> {
    let mut got: Vec<_> = std::mem::take(&mut *scored.lock().unwrap())
        .into_iter()
        .map(|(p, r)| (p.level.key(), r))
        .collect();
    sort(&mut got);
    got
}

fn sort(v: &mut [(String, f64)]) {
    v.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
}

fn assert_same(got: &[(String, f64)], want: &[(String, f64)]) {
    assert_eq!(got.len(), want.len(), "got {got:?}, want {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!(
            g.0 == w.0 && (g.1 - w.1).abs() < 1e-9,
            "got {got:?}, want {want:?}"
        );
    }
}

#[test]
fn paired_adversaries_learn_the_regret_of_the_antagonist_over_the_protagonist() {
    let sabotage = Sabotage {
        unusable_seeds: vec![5, 6, 7],
        infra_seeds: vec![8],
        ..Sabotage::default()
    };
    let mut p = paired(Box::new(FakeCritic::default()), sabotage);
    let mut cfg = ScheduleConfig::new(Method::Paired, space(DIMS, 1, 1.0, 20), 4);
    cfg.adversary_batch = 3;
    cfg.lambda = 0.5;
    cfg.dr_share = 0.25;
    let mut s = build(&cfg, &p.roles).unwrap();
    let (mut scored, mut unusable, mut nonzero, mut dr) = (0, 0, 0, 0);
    for _ in 0..8 {
        let it = s.iterate(&mut p.roles).unwrap();
        assert_eq!(it.phase, Some(Phase::Protagonist));
        assert!(it.protagonist.is_some() && it.antagonist.is_some());
        assert!(
            it.critic.is_some(),
            "the critic did not learn with lambda 0.5"
        );
        for o in &it.outcomes {
            assert!(o.learn);
            match o.origin {
                Origin::Random => {
                    assert_eq!(o.agent, "protagonist", "the antagonist got a DR level");
                    assert_eq!(o.tag, None);
                    dr += 1;
                }
                Origin::Adversary(_) => assert!(o.tag.is_some()),
                other => panic!("origin {other:?} in PAIRED"),
            }
        }
        for k in 0..2 {
            let got = take_scored(&p.scored[k]);
            let want = expected_regrets(&it.outcomes, k, cfg.lambda);
            assert_same(&got, &want);
            assert_eq!(it.adversaries.iter().any(|a| a.0 == k), !want.is_empty());
            scored += want.len();
            unusable += want.iter().filter(|w| w.1 == UNUSABLE_REWARD).count();
            nonzero += want
                .iter()
                .filter(|w| w.1 != UNUSABLE_REWARD && (w.1 + cfg.lambda).abs() > 1e-9)
                .count();
        }
    }
    assert!(
        scored > 20 && unusable > 0 && nonzero > 0 && dr > 0,
        "scored {scored}, unusable {unusable}, non-zero regrets {nonzero}, DR episodes {dr}"
    );
    for (who, log) in [
        ("protagonist", &p.protagonist),
        ("antagonist", &p.antagonist),
    ] {
        let log = log.lock().unwrap();
        assert_eq!(log.updates, 8, "{who}");
        assert!(log.learned_samples > 0, "{who} learned nothing");
    }
}

#[test]
fn paired_with_lambda_0_scores_pure_regret_without_the_critic() {
    let mut p = paired(Box::new(RefusingCritic), Sabotage::default());
    let mut cfg = ScheduleConfig::new(Method::Paired, space(DIMS, 1, 1.0, 20), 8);
    cfg.adversary_batch = 2;
    cfg.dr_share = 0.0;
    let mut s = build(&cfg, &p.roles).unwrap();
    for _ in 0..3 {
        let it = s.iterate(&mut p.roles).unwrap();
        assert!(it.critic.is_none());
        for k in 0..2 {
            let got = take_scored(&p.scored[k]);
            assert_same(&got, &expected_regrets(&it.outcomes, k, 0.0));
        }
    }
}

#[test]
fn paired_goes_on_when_every_proposal_is_unusable() {
    // The adversaries draw task seeds 0..20, all unusable; DR draws from 0..40.
    let sabotage = Sabotage {
        unusable_seeds: (0..20).collect(),
        ..Sabotage::default()
    };
    let mut p = paired(Box::new(FakeCritic::default()), sabotage);
    let mut cfg = ScheduleConfig::new(Method::Paired, space(DIMS, 1, 1.0, 40), 5);
    cfg.adversary_batch = 3;
    cfg.dr_share = 0.5;
    let mut s = build(&cfg, &p.roles).unwrap();
    for _ in 0..3 {
        let it = s.iterate(&mut p.roles).unwrap();
        assert!(it.antagonist.is_some());
        let antagonist: Vec<_> = it
            .outcomes
            .iter()
            .filter(|o| o.agent == "antagonist")
            .collect();
        assert!(!antagonist.is_empty());
        assert!(
            antagonist.iter().all(|o| o.origin == Origin::Random),
            "the antagonist played a proposal the protagonist found unusable"
        );
        assert!(antagonist.iter().any(|o| o.counted()));
        for k in 0..2 {
            let got = take_scored(&p.scored[k]);
            assert_eq!(got.len(), 3, "adversary {k}: {got:?}");
            assert!(got.iter().all(|g| g.1 == UNUSABLE_REWARD), "{got:?}");
        }
    }
    assert!(p.antagonist.lock().unwrap().learned_samples > 0);
}

// ---------------------------------------------------------------- robust PLR, ACCEL

/// What the spies saw: the level on each worker, and the samples the agent recorded as
/// valid or not, on replayed levels or others.
#[derive(Default)]
struct Seen {
    current: Vec<Option<Level>>,
    valid_on_replay: u64,
    /// Must stay 0: samples valid on a level that is not a replay, or invalid on a replay.
    wrong: Vec<String>,
    invalid_elsewhere: u64,
}

struct SpyWorkers(ThreadWorkers<FakeWorker>, Arc<Mutex<Seen>>);

impl Workers for SpyWorkers {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn reset(&mut self, levels: &[(usize, Level)]) -> Vec<Result<Start, Failure>> {
        let r = self.0.reset(levels);
        let mut s = self.1.lock().unwrap();
        for ((i, l), r) in levels.iter().zip(&r) {
            s.current[*i] = r.is_ok().then(|| l.clone());
        }
        r
    }
    fn step(&mut self, actions: &[Option<u32>]) -> Vec<Option<StepResult>> {
        self.0.step(actions)
    }
}

struct SpyAgent(FakeAgent, Arc<Mutex<Seen>>, Vec<Level>);

impl Agent for SpyAgent {
    fn rollout_len(&self) -> usize {
        self.0.rollout_len()
    }
    fn act(&mut self, obs: &[f32], masks: &[f32], n: usize) -> Result<Acted, RoleError> {
        self.0.act(obs, masks, n)
    }
    fn record(&mut self, step: &Recorded) -> Result<(), RoleError> {
        let mut s = self.1.lock().unwrap();
        for (i, &valid) in step.valid.iter().enumerate() {
            let replay = s.current[i].as_ref().is_some_and(|l| self.2.contains(l));
            match (valid, replay) {
                (true, true) => s.valid_on_replay += 1,
                (false, false) => s.invalid_elsewhere += 1,
                _ => {
                    let w = format!("valid {valid} on {:?}", s.current[i]);
                    s.wrong.push(w);
                }
            }
        }
        drop(s);
        self.0.record(step)
    }
    fn learn(&mut self, next: &[f32], n: usize) -> Result<LearnStats, RoleError> {
        self.0.learn(next, n)
    }
    fn save(&self, dir: &Path) -> Result<(), RoleError> {
        self.0.save(dir)
    }
}

/// A buffer of fixed levels (task seeds outside the space's range, so no fresh draw
/// equals one): replays one at random with probability `replay` (`None`: replay and fresh
/// in strict alternation, a replay first), and logs what it scores.
struct FixedReplays {
    levels: Vec<Level>,
    replay: Option<f64>,
    picks: u64,
    rng: rand_chacha::ChaCha8Rng,
    scored: Arc<Mutex<Vec<(Origin, Level)>>>,
}

impl Curriculum for FixedReplays {
    fn pick(&mut self) -> Result<Pick, RoleError> {
        self.picks += 1;
        let replay = match self.replay {
            Some(p) => self.rng.gen::<f64>() < p,
            None => self.picks % 2 == 1,
        };
        if replay {
            let i = self.rng.gen_range(0..self.levels.len());
            return Ok(Pick::Replay(self.levels[i].clone()));
        }
        Ok(Pick::Fresh)
    }
    fn update(&mut self, o: &EpisodeOutcome) -> Result<(), RoleError> {
        if !o.counted() {
            return Err(RoleError::new("curriculum", "a failed episode was scored"));
        }
        self.scored
            .lock()
            .unwrap()
            .push((o.origin, o.level.clone()));
        Ok(())
    }
    fn len(&self) -> usize {
        self.levels.len()
    }
    fn save(&self, _: &Path) -> Result<(), RoleError> {
        Ok(())
    }
}

struct Replays {
    roles: Roles,
    seen: Arc<Mutex<Seen>>,
    log: Log,
    scored: Arc<Mutex<Vec<(Origin, Level)>>>,
}

fn replays(levels: Vec<Level>, replay: Option<f64>, sabotage: Sabotage) -> Replays {
    let seen = Arc::new(Mutex::new(Seen {
        current: vec![None; 4],
        ..Seen::default()
    }));
    let (a, log) = agent(3);
    let scored = Arc::default();
    let curriculum = FixedReplays {
        levels: levels.clone(),
        replay,
        picks: 0,
        rng: rand_chacha::ChaCha8Rng::seed_from_u64(11),
        scored: Arc::clone(&scored),
    };
    Replays {
        roles: Roles {
            protagonist: Box::new(SpyAgent(a, seen.clone(), levels)),
            antagonist: None,
            adversaries: Vec::new(),
            critic: None,
            curriculum: Some(Box::new(curriculum)),
            workers: Box::new(SpyWorkers(fake_workers(4, &sabotage), seen.clone())),
        },
        seen,
        log,
        scored,
    }
}

fn level(seed: u64, choices: &[u32]) -> Level {
    Level {
        seed,
        choices: choices.to_vec(),
    }
}

/// Runs `iterations` of `method` and checks what robust PLR and ACCEL share: gradient only
/// on replays, every counted episode scored, no failed one. Returns every outcome.
fn run_replays(
    method: Method,
    sp: LevelSpace,
    r: &mut Replays,
    iterations: usize,
) -> Vec<EpisodeOutcome> {
    let cfg = ScheduleConfig::new(method, sp, 6);
    let mut s = build(&cfg, &r.roles).unwrap();
    let mut all = Vec::new();
    for _ in 0..iterations {
        let it = s.iterate(&mut r.roles).unwrap();
        assert_eq!(it.phase, Some(Phase::Protagonist));
        assert!(it.protagonist.is_some());
        assert_eq!(it.buffer, Some(r.roles.curriculum.as_ref().unwrap().len()));
        let counted: Vec<_> = it.outcomes.iter().filter(|o| o.counted()).collect();
        let scored = std::mem::take(&mut *r.scored.lock().unwrap());
        assert_eq!(
            scored,
            counted
                .iter()
                .map(|o| (o.origin, o.level.clone()))
                .collect::<Vec<_>>(),
            "the curriculum did not score exactly the counted episodes"
        );
        for o in &it.outcomes {
            assert_eq!(o.learn, o.origin == Origin::Replay, "{o:?}");
        }
        all.extend(it.outcomes);
    }
    assert_eq!(s.updates(), iterations as u64);
    let seen = r.seen.lock().unwrap();
    assert!(seen.wrong.is_empty(), "{:?}", seen.wrong);
    let log = r.log.lock().unwrap();
    assert_eq!(log.updates, iterations as u64);
    assert_eq!(log.learned_samples, seen.valid_on_replay);
    assert_eq!(log.invalid_samples, seen.invalid_elsewhere);
    all
}

#[test]
fn robust_plr_learns_only_from_replays_and_scores_every_counted_episode() {
    let buffer = vec![level(1000, &[1, 0, 0]), level(1001, &[0, 0, 1])];
    let sabotage = Sabotage {
        infra_seeds: vec![3, 4],
        unusable_seeds: vec![5],
        ..Sabotage::default()
    };
    let mut r = replays(buffer, Some(0.5), sabotage);
    let all = run_replays(Method::Plr, space(DIMS, 1, 1.0, 20), &mut r, 20);
    let failed = all.iter().filter(|o| !o.counted()).count();
    let fresh = all.iter().filter(|o| o.origin == Origin::Random).count();
    let replayed = all.iter().filter(|o| o.origin == Origin::Replay).count();
    assert!(
        failed > 0 && fresh > 0 && replayed > 0,
        "failed {failed}, fresh {fresh}, replayed {replayed}"
    );
    let seen = r.seen.lock().unwrap();
    assert!(seen.valid_on_replay > 0 && seen.invalid_elsewhere > 0);
}

#[test]
fn robust_plr_updates_even_when_every_level_is_fresh() {
    let mut r = replays(
        vec![level(1000, &[1, 0, 0])],
        Some(0.0),
        Sabotage::default(),
    );
    run_replays(Method::Plr, space(DIMS, 1, 1.0, 20), &mut r, 3);
    let log = r.log.lock().unwrap();
    assert_eq!(log.learned_samples, 0);
    assert_eq!(log.invalid_samples, 3 * 4 * 4, "every sample is invalid");
}

#[test]
fn accel_mutates_replays_in_one_or_two_faults_and_keeps_their_task_seed() {
    let sp = space(DIMS, 2, 2.0, 20);
    let buffer = vec![
        level(1000, &[1, 0, 0]),
        level(1001, &[0, 2, 0]),
        level(1002, &[1, 0, 2]),
    ];
    let mut r = replays(buffer.clone(), Some(0.5), Sabotage::default());
    let all = run_replays(Method::Accel, sp.clone(), &mut r, 20);
    let mutations: Vec<_> = all
        .iter()
        .filter(|o| o.origin == Origin::Mutation)
        .collect();
    assert!(mutations.len() > 10, "{} mutations played", mutations.len());
    for m in &mutations {
        let parent = buffer
            .iter()
            .find(|p| p.seed == m.level.seed)
            .unwrap_or_else(|| panic!("mutation {} has no parent of its task seed", m.level.key()));
        let changed = parent
            .choices
            .iter()
            .zip(&m.level.choices)
            .filter(|(a, b)| a != b)
            .count();
        assert!(
            (1..=2).contains(&changed),
            "{} -> {}",
            parent.key(),
            m.level.key()
        );
        sp.check(&m.level).unwrap();
    }
}

#[test]
fn accel_plays_a_waiting_mutation_before_any_fresh_dr_level() {
    // Replay, fresh, replay, fresh, ...: every fresh pick finds the mutation of the replay
    // before it waiting, so no DR level is ever played.
    let buffer = vec![level(1000, &[1, 0, 0]), level(1001, &[0, 2, 0])];
    let mut r = replays(buffer, None, Sabotage::default());
    let all = run_replays(Method::Accel, space(DIMS, 2, 2.0, 20), &mut r, 6);
    let count = |origin| all.iter().filter(|o| o.origin == origin).count();
    assert_eq!(
        count(Origin::Random),
        0,
        "a DR level was played while a mutation waited"
    );
    assert!(count(Origin::Mutation) > 10 && count(Origin::Replay) > 10);
}

// ---------------------------------------------------------------- SFL

/// A one-step environment whose success is scripted by the level's task seed, so every
/// level's learnability is known: seed % 4 = 0 never succeeds (p 0), 1 every other episode
/// (p 0.5, learnability 0.25), 2 three episodes in four (0.1875), 3 always (0). Seeds in
/// `unusable` cannot be played; those in `late` are found unusable only in the step of
/// every other episode.
struct Scripted {
    plays: Arc<Mutex<HashMap<Level, u32>>>,
    unusable: Vec<u64>,
    late: Vec<u64>,
    success: bool,
    fail: bool,
}

fn learnability(seed: u64) -> f64 {
    [0.0, 0.25, 0.1875, 0.0][(seed % 4) as usize]
}

impl EnvWorker for Scripted {
    fn reset(&mut self, level: &Level) -> Result<Start, Failure> {
        if self.unusable.contains(&level.seed) {
            return Err(Failure::new(FailureKind::Unusable, "scripted"));
        }
        let mut plays = self.plays.lock().unwrap();
        let n = plays.entry(level.clone()).or_default();
        *n += 1;
        self.fail = self.late.contains(&level.seed) && n.is_multiple_of(2);
        self.success = match level.seed % 4 {
            0 => false,
            1 => n.is_multiple_of(2),
            2 => !n.is_multiple_of(4),
            _ => true,
        };
        Ok(Start {
            obs: vec![0.0; DIMS + 1],
            mask: vec![1.0; FakeWorker::actions(DIMS)],
        })
    }
    fn step(&mut self, _: u32) -> StepResult {
        if self.fail {
            return Err(Failure::new(FailureKind::Unusable, "scripted, late"));
        }
        Ok(Transition {
            obs: vec![0.0; DIMS + 1],
            mask: vec![1.0; FakeWorker::actions(DIMS)],
            reward: if self.success { 1.0 } else { 0.0 },
            terminated: true,
            truncated: false,
            success: self.success,
            progress: 0.0,
        })
    }
}

fn sfl_roles(unusable: &[u64], late: &[u64]) -> Roles {
    let plays = Arc::default();
    let ws = (0..4)
        .map(|_| Scripted {
            plays: Arc::clone(&plays),
            unusable: unusable.to_vec(),
            late: late.to_vec(),
            success: false,
            fail: false,
        })
        .collect();
    Roles {
        protagonist: Box::new(agent(4).0),
        antagonist: None,
        adversaries: Vec::new(),
        critic: None,
        curriculum: None,
        workers: Box::new(ThreadWorkers::new(ws)),
    }
}

#[test]
fn sfl_keeps_the_most_learnable_levels_and_trains_only_on_them_and_dr() {
    let unusable = [1, 5, 9, 13];
    let mut roles = sfl_roles(&unusable, &[]);
    let mut cfg = ScheduleConfig::new(Method::Sfl, space(DIMS, 1, 1.0, 20), 12);
    cfg.sfl_candidates = 12;
    cfg.sfl_rollouts = 4;
    cfg.sfl_keep = 3;
    cfg.sfl_every = 3;
    cfg.dr_share = 0.25;
    let mut s = build(&cfg, &roles).unwrap();
    let mut phases = Vec::new();
    // Per selection: (the keep-th best learnability, the levels above it, the usable count).
    let mut threshold = 0.0;
    let mut above: Vec<Level> = Vec::new();
    let mut drawn: Vec<Level> = Vec::new();
    let mut dr = 0;
    let check_draws = |drawn: &mut Vec<Level>, above: &[Level]| {
        drawn.sort();
        drawn.dedup();
        assert!(drawn.len() <= 3, "trained on {} kept levels", drawn.len());
        for l in above {
            assert!(
                drawn.contains(l),
                "{} was more learnable than the cut but never drawn",
                l.key()
            );
        }
        drawn.clear();
    };
    for _ in 0..8 {
        let it = s.iterate(&mut roles).unwrap();
        let phase = it.phase.unwrap();
        phases.push(phase);
        if phase == Phase::Selection {
            check_draws(&mut drawn, &above);
            assert!(it.protagonist.is_none());
            assert_eq!(it.outcomes.len(), 12 * 4);
            assert!(it
                .outcomes
                .iter()
                .all(|o| !o.learn && o.origin == Origin::Random));
            let mut cands: BTreeMap<u64, &Level> = BTreeMap::new();
            for o in &it.outcomes {
                cands.insert(o.tag.unwrap(), &o.level);
            }
            let usable: Vec<&Level> = cands
                .values()
                .copied()
                .filter(|l| !unusable.contains(&l.seed))
                .collect();
            let mut ls: Vec<f64> = usable.iter().map(|l| learnability(l.seed)).collect();
            ls.sort_by(|a, b| b.total_cmp(a));
            threshold = ls.get(2).copied().unwrap_or(0.0);
            above = usable
                .iter()
                .filter(|l| learnability(l.seed) > threshold)
                .map(|l| (*l).clone())
                .collect();
            // Degenerate when every candidate is as learnable as every other.
            assert!(
                ls[0] > ls[ls.len() - 1],
                "learnabilities {ls:?}: pick another seed"
            );
            assert_eq!(it.buffer, Some(usable.len().min(3)));
        } else {
            assert!(it.protagonist.is_some());
            for o in &it.outcomes {
                assert!(o.learn);
                match o.origin {
                    Origin::Random => dr += 1,
                    Origin::Replay => {
                        assert!(!unusable.contains(&o.level.seed), "kept an unusable level");
                        assert!(
                            learnability(o.level.seed) >= threshold,
                            "trained on {} below the cut {threshold}",
                            o.level.key()
                        );
                        drawn.push(o.level.clone());
                    }
                    other => panic!("origin {other:?} in SFL training"),
                }
            }
        }
    }
    check_draws(&mut drawn, &above);
    assert!(dr > 0, "no DR level was mixed in");
    use Phase::*;
    assert_eq!(
        phases,
        [
            Selection,
            Protagonist,
            Protagonist,
            Protagonist,
            Selection,
            Protagonist,
            Protagonist,
            Protagonist
        ]
    );
    assert_eq!(s.updates(), 6);
}

#[test]
fn sfl_leaves_out_levels_found_unusable_at_reset_or_in_a_step() {
    // Seeds 0, 3, 6, ... fail their resets; 1, 4, 7, ... every other episode's step.
    let unusable: Vec<u64> = (0..20).filter(|s| s % 3 == 0).collect();
    let late: Vec<u64> = (0..20).filter(|s| s % 3 == 1).collect();
    let mut roles = sfl_roles(&unusable, &late);
    let mut cfg = ScheduleConfig::new(Method::Sfl, space(DIMS, 1, 1.0, 20), 2);
    cfg.sfl_candidates = 10;
    cfg.sfl_rollouts = 2;
    cfg.sfl_keep = 10;
    let mut s = build(&cfg, &roles).unwrap();
    let it = s.iterate(&mut roles).unwrap();
    let mut tags: BTreeMap<u64, u64> = BTreeMap::new();
    for o in &it.outcomes {
        tags.insert(o.tag.unwrap(), o.level.seed);
    }
    let usable = tags
        .values()
        .filter(|s| !unusable.contains(s) && !late.contains(s))
        .count();
    assert!(
        tags.values().any(|s| unusable.contains(s)) && tags.values().any(|s| late.contains(s)),
        "no candidate of each kind was unusable: pick another seed"
    );
    assert!(
        it.outcomes
            .iter()
            .any(|o| late.contains(&o.level.seed) && o.counted()),
        "no late-unusable candidate had a counted episode"
    );
    assert_eq!(it.buffer, Some(usable));
}

#[test]
fn sfl_settings_out_of_range_are_refused_by_key() {
    let base = ScheduleConfig::new(Method::Sfl, space(DIMS, 1, 1.0, 20), 1);
    type Change = fn(&mut ScheduleConfig);
    let cases: [(&str, Change); 5] = [
        ("sfl_candidates", |c| c.sfl_candidates = 0),
        ("sfl_rollouts", |c| c.sfl_rollouts = 0),
        ("sfl_keep", |c| c.sfl_keep = 0),
        ("sfl_every", |c| c.sfl_every = 0),
        ("sfl_keep", |c| c.sfl_keep = c.sfl_candidates + 1),
    ];
    let roles = sfl_roles(&[], &[]);
    for (key, change) in cases {
        let mut cfg = base.clone();
        change(&mut cfg);
        let e = build(&cfg, &roles).err().unwrap().to_string();
        assert!(e.contains(&format!("`{key}`")), "{key}: {e}");
    }
    build(&base, &roles).unwrap();
}
