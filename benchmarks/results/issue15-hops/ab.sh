#!/bin/bash
# usage: ab.sh RATE PAIRS TAG  -> alternating base/new cpu_cost runs
R=$1; N=$2; T=$3; OUT=/tmp/s16/ab-$T; mkdir -p $OUT
for i in $(seq 1 $N); do
  for v in base new; do
    if [ $v = base ]; then D=/tmp/s16/base; else D=/work/main; fi
    (cd $D && /work/main/.venv/bin/python -m styx_py.benchmarks.cpu_cost --rate $R --seconds 15 > $OUT/$v-$i.txt 2>&1)
    echo "$v $i $(grep -E 'YCSB' $OUT/$v-$i.txt | sed 's/.*answered, //') | $(grep total $OUT/$v-$i.txt | awk '{print $2}') | $(grep machine $OUT/$v-$i.txt | sed 's/.*took //')"
  done
done
