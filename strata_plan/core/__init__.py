"""The base the planner and the engine share, importing neither: what a model is (`spec`, the shipped
`models/`, one module per model family in `families`), which experts its tokens use (`routing`: traces,
statistics, priors), the plan file both sides read (`plan`), the run modes (`modes`) and the lookahead facts
(`lookahead`). No cost model, no engine."""
