import sys
from bench.hf_models import run, table
rows = [run("nanogpt_block", sys.argv[1], "masked_fill", time_limit_s=120)]
print(table(rows)); print(rows[0]["eager"], rows[0]["time_limited_ops"])
