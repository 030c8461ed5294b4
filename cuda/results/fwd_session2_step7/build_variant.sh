#!/bin/bash
# Step 7: W = scratch dir (cfg_NAME.h, ptxas_NAME.log, tc_NAME.o); the binaries are gzipped into gpu-carry-fwd3/.
# Step 6 helper script (as used): builds one variant of attention_fwd_tc.cu with a cfg header and links it ahead of
# build-fwd3/libflashlab_cuda.a; paths are those of the session (/tmp/fwd3w work dir).
# usage: build.sh NAME SRC CFGLINE...   (cfg lines written to cfg_NAME.h)
set -e
NAME=$1; SRC=$2; shift 2
M=/work/main
W=/tmp/fwd4w
: > $W/cfg_$NAME.h
for l in "$@"; do echo "$l" >> $W/cfg_$NAME.h; done
cd $M
nvcc -O3 -DNDEBUG --generate-code=arch=compute_90,code=[compute_90,sm_90] -Xcompiler=-fPIC -lineinfo --expt-relaxed-constexpr -std=c++17 -Xptxas -v -include $W/cfg_$NAME.h -Icuda/include -Icuda/src -Ireference/include -x cu -c $SRC -o $W/tc_$NAME.o > $W/ptxas_$NAME.log 2>&1
cd $M/build-fwd3/app
/usr/bin/c++ -O3 -DNDEBUG CMakeFiles/flashlab.dir/main.cpp.o CMakeFiles/flashlab.dir/cli.cpp.o CMakeFiles/flashlab.dir/cmd_demo.cpp.o CMakeFiles/flashlab.dir/cmd_run.cpp.o CMakeFiles/flashlab.dir/cmd_step.cpp.o CMakeFiles/flashlab.dir/cmd_lesson.cpp.o CMakeFiles/flashlab.dir/cmd_attention.cpp.o CMakeFiles/flashlab.dir/cmd_traffic.cpp.o CMakeFiles/flashlab.dir/cmd_mta.cpp.o CMakeFiles/flashlab.dir/cmd_stream.cpp.o CMakeFiles/flashlab.dir/cmd_bench.cpp.o CMakeFiles/flashlab.dir/cuda_traffic.cpp.o $W/tc_$NAME.o -o $W/flashlab_$NAME   -L/usr/local/cuda/targets/x86_64-linux/lib  ../toymachine/libflashlab_toymachine.a ../lessons/libflashlab_lessons.a /usr/lib/x86_64-linux-gnu/libboost_program_options.a ../cuda/libflashlab_cuda.a /usr/lib/x86_64-linux-gnu/libncursesw.a /usr/lib/x86_64-linux-gnu/libtinfo.a ../toymachine/libflashlab_toymachine.a ../reference/libflashlab_attention.a ../reference/libflashlab_mta.a ../reference/libflashlab_stream.a ../reference/libflashlab_reference_core.a /usr/local/cuda/lib/libcudart_static.a /usr/lib/x86_64-linux-gnu/librt.a -ldl -lcudadevrt -lcudart_static -lrt -lpthread -ldl
cd $M/build-fwd3/tests/cuda
/usr/bin/c++ -O3 -DNDEBUG CMakeFiles/test_cuda.dir/test_cuda_main.cpp.o CMakeFiles/test_cuda.dir/test_cuda_attention.cpp.o CMakeFiles/test_cuda.dir/test_cuda_traffic.cpp.o CMakeFiles/test_cuda.dir/test_cuda_fast.cpp.o CMakeFiles/test_cuda.dir/test_cuda_fast_bwd.cpp.o $W/tc_$NAME.o -o $W/test_cuda_$NAME   -L/usr/local/cuda/targets/x86_64-linux/lib  ../../cuda/libflashlab_cuda.a ../../reference/libflashlab_attention.a /usr/local/cuda/lib/libcudart_static.a /usr/lib/x86_64-linux-gnu/librt.a -ldl ../../reference/libflashlab_reference_core.a -lcudadevrt -lcudart_static -lrt -lpthread -ldl
strip $W/flashlab_$NAME $W/test_cuda_$NAME
gzip -c $W/flashlab_$NAME > $M/gpu-carry-fwd3/flashlab_$NAME.gz; gzip -c $W/test_cuda_$NAME > $M/gpu-carry-fwd3/test_cuda_$NAME.gz
grep -E "fast_fwd|registers|spill" $W/ptxas_$NAME.log | grep -B1 -A2 "Compiling entry" | head -0
echo built $NAME
