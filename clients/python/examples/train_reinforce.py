"""A hand-written REINFORCE loop (numpy only) over catalogue actions of `engine serve`.

    engine serve &                                    # prints its address
    python clients/python/examples/train_reinforce.py --url http://127.0.0.1:8000

A linear softmax policy over the server's features; episodes from N concurrent sessions
(EnvFactoryVectorEnv); steps flagged `infra_failure` are masked out of the gradient.
"""

import argparse

import numpy as np

from envfactory import EnvFactoryVectorEnv


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--task", default="archive-logs")
    ap.add_argument("--envs", type=int, default=4)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--horizon", type=int, default=24, help="steps per session per iteration")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--gamma", type=float, default=0.99)
    a = ap.parse_args()

    venv = EnvFactoryVectorEnv(a.url, num_envs=a.envs, task=a.task, seeds=list(range(1, 9)))
    n_actions = len(venv.catalogue)
    dim = venv.single_observation_space.shape[0]
    rng = np.random.default_rng(0)
    w = np.zeros((dim, n_actions))
    obs, _ = venv.reset(seed=0)
    try:
        for it in range(1, a.iterations + 1):
            traj = []  # (obs, action, reward, done, mask)
            successes = 0
            for _ in range(a.horizon):
                logits = obs @ w
                p = np.exp(logits - logits.max(axis=1, keepdims=True))
                p /= p.sum(axis=1, keepdims=True)
                acts = np.array([rng.choice(n_actions, p=pi) for pi in p])
                nxt, rew, term, trunc, info = venv.step(acts)
                traj.append((obs, acts, p, rew, term | trunc, ~info["infra_failure"]))
                successes += int(info["success"].sum())
                obs = nxt
            # Discounted returns per session, cut at episode ends.
            ret = np.zeros(a.envs)
            grads = np.zeros_like(w)
            returns = []
            for o, act, p, rew, done, mask in reversed(traj):
                ret = rew + a.gamma * ret * (~done)
                returns.append(ret.copy())
                onehot = np.eye(n_actions)[act]
                adv = (ret - ret.mean()) * mask
                grads += o.T @ ((onehot - p) * adv[:, None])
            w += a.lr * grads / (a.horizon * a.envs)
            mean_r = float(np.mean([t[3].mean() for t in traj]))
            print(f"iteration {it}: mean step reward {mean_r:+.4f}, successes {successes}", flush=True)
    finally:
        venv.close()


if __name__ == "__main__":
    main()
