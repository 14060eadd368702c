"""docs/running.md's config-group table is the one conf/ gives (`python -m pipeline --help`), PPO's options included."""

from docs_tables import PAGE, help_groups, page_table, table


def test_the_config_group_table_is_what_help_lists():
    groups = help_groups()
    assert "ppo" in groups["task"] and "actor_critic" in groups["model"] and "ppo_cartpole" in groups["experiment"]
    documented = page_table(PAGE.read_text())
    assert documented == table(groups), "docs/running.md's table is out of date: run `python tests/docs_tables.py`"
    for group, options in groups.items():  # every group and option --help lists is in a row of the page
        row = next(line for line in documented.splitlines() if line.startswith(f"| `{group}` |"))
        assert all(f"`{o}`" in row for o in options), group
