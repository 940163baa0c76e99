"""Print the distinct ERROR messages and the worst FAIL rows of result CSVs (a GPU-run helper).

    python benchmarks/show_problems.py results/*/results.csv
"""
import sys

import pandas as pd

for path in sys.argv[1:]:
    df = pd.read_csv(path)
    bad = df[df["verdict"].isin(["FAIL", "ERROR"])]
    print(f"== {path}: {len(df)} rows, {df['verdict'].value_counts().to_dict()}")
    for (variant, verdict), group in bad.groupby(["variant", "verdict"]):
        if verdict == "ERROR":
            for message in group["message"].drop_duplicates().head(3):
                print(f"  ERROR {variant}: {message[:700]}")
        else:
            worst = group.sort_values("ratio", ascending=False).head(4)
            for _, r in worst.iterrows():
                print(f"  FAIL {variant} {r['case_id']} {r['tensor']}: {str(r['message'])[:300]}")
            print(f"  FAIL {variant}: tensors {group['tensor'].value_counts().to_dict()}, "
                  f"T {sorted(group['T'].unique())}")
