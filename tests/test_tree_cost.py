"""specdemo.bench.tree_cost: verification cost per row count, chain and tree, against one row."""

import pandas as pd

from specdemo.bench.tree_cost import COST_COLUMNS, bushy_tree, largest_budget, verification_costs


def test_a_bushy_tree_fills_each_node_with_children_breadth_first():
    tree = bushy_tree(7, width=3)
    assert tree.parents[1:] == [0, 0, 0, 1, 1, 1, 2]
    assert len(bushy_tree(0)) == 0


def test_costs_are_ratios_to_one_row_for_every_row_count(tiny_pair, one_thread):
    table = verification_costs(tiny_pair, [1, 5, 6, 7, 8], max_rows=4, calls=2, warmup=0)
    assert list(table.columns) == COST_COLUMNS and list(table.rows) == [1, 2, 3, 4]
    assert table.chain_cost[0] == 1.0
    assert (table.tree_cost == table.tree_seconds / table.chain_seconds[0]).all()
    assert (table[["chain_seconds", "tree_seconds"]] > 0).all().all()


def test_the_largest_budget_is_the_most_rows_within_the_bound_less_the_root():
    table = pd.DataFrame({"rows": [1, 2, 3, 4, 5], "tree_cost": [1.0, 1.1, 1.25, 1.2, 1.6]})
    assert largest_budget(table, 1.3) == 3
    assert largest_budget(table, 0.5) == 0
