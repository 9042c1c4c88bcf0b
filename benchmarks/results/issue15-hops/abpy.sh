#!/bin/bash
# usage: abpy.sh RATE ROUNDS TAG  -> 3.11 / 3.12 / 3.13 alternating
R=$1; N=$2; T=$3; OUT=/tmp/s16/ab-$T; mkdir -p $OUT
for i in $(seq 1 $N); do
  for v in 311 312 313; do
    case $v in 311) P=/work/main/.venv/bin/python;; 312) P=/tmp/s16/venv3.12.1/bin/python;; 313) P=/tmp/s16/venv3.13.0/bin/python;; esac
    (cd /work/main && $P -m styx_py.benchmarks.cpu_cost --rate $R --seconds 15 > $OUT/$v-$i.txt 2>&1)
    echo "$v $i $(grep -E 'YCSB' $OUT/$v-$i.txt | sed 's/.*answered, //;s/(run.*//') | $(grep total $OUT/$v-$i.txt | awk '{print $2}') | w1 $(grep ' w1 ' $OUT/$v-$i.txt | awk '{print $2}') | coord $(grep coordinator $OUT/$v-$i.txt | awk '{print $2}') | tansu $(grep tansu $OUT/$v-$i.txt | awk '{print $2}') | client $(grep 'client+driver' $OUT/$v-$i.txt | awk '{print $2}') | $(grep machine $OUT/$v-$i.txt | sed 's/.*took //;s/ before the run, / /;s/ after//')"
  done
done
