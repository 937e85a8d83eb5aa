"""The RL trainer behind ``rstar2 train``.

:mod:`rstar2.trainer.loop` runs a run folder end to end (see its docstring);
:mod:`rstar2.trainer.batch` turns scored rollouts into the learner's batch (RoC, advantages; pure);
:mod:`rstar2.trainer.rollout` collects a step's rollouts and records / replays them;
:mod:`rstar2.trainer.state` holds what a resume needs and the seeded prompt order;
:mod:`rstar2.trainer.curves` draws ``curves.png``.
"""
