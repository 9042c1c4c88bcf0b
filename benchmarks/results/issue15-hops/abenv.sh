#!/bin/bash
# usage: abenv.sh RATE PAIRS TAG "ENV_A" "ENV_B"
R=$1; N=$2; T=$3; OUT=/tmp/s16/ab-$T; mkdir -p $OUT
for i in $(seq 1 $N); do
  for v in A B; do
    if [ $v = A ]; then E="$4"; else E="$5"; fi
    (cd /work/main && env $E /work/main/.venv/bin/python -m styx_py.benchmarks.cpu_cost --rate $R --seconds 15 > $OUT/$v-$i.txt 2>&1)
    echo "$v $i $(grep -E 'YCSB' $OUT/$v-$i.txt | sed 's/.*answered, //;s/(run.*//') | $(grep total $OUT/$v-$i.txt | awk '{print $2}') | $(grep 'client+driver' $OUT/$v-$i.txt | awk '{print $2}') | $(grep machine $OUT/$v-$i.txt | sed 's/.*took //;s/ before the run, / /;s/ after//')"
  done
done
