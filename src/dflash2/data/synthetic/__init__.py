"""The synthetic training prompts: `conversations` (the mix), `math` + `math_more` (word problems),
`code` + `specs` (programming requests), `tasks` + `tasks_num` (the Python tasks with references)."""
