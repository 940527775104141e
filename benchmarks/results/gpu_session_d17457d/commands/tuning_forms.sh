# Writes tuning_forms.md beside this folder: the backward-form table that
# `scripts/bench_attention.py --render` prints for runs 1, 3 and 4 (no GPU needed).
# Run from the repository root: bash benchmarks/results/gpu_session_d17457d/commands/tuning_forms.sh
D=benchmarks/results/gpu_session_d17457d
{
echo "# The autotuner's backward timings by launch form, runs 1, 3 and 4"
echo
echo "Each table is the backward-form section that \`scripts/bench_attention.py --render\` prints"
echo "for that run's result file: the tuner's own timings on the H200 (\`tuning_ms\`, each"
echo "candidate's better round of two) of the fastest backward candidate of each launch form,"
echo "and their ratios of times (below 1: the first is faster). Written by"
echo "\`bash $D/commands/tuning_forms.sh\`."
for r in run1/attn_large run3/attn_large run4/attn_varied; do
  echo; echo "## $r"; echo
  echo "\`python scripts/bench_attention.py --render $D/$r/attention_graph_nvidia_h200.json\`"; echo
  python3 scripts/bench_attention.py --render $D/$r/attention_graph_nvidia_h200.json \
    | awk '/^## The autotuner.s backward timings/ {on = 1; next} on && /^(## |Not run:)/ {exit} on && /^\|/'
done
} > $D/tuning_forms.md
