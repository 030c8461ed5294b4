// The `flashlab` subcommands. Each lives in its own cmd_<name>.cpp, parses its flags with
// Boost.Program_options, calls one library, and formats the result — no algorithm code here.
#pragma once

#include "core/cli.hpp"

namespace flashlab::app {

int cmd_run(const Args& args);        ///< run a toy-machine trace (cmd_run.cpp)
int cmd_machines(const Args& args);   ///< list machine profiles (cmd_run.cpp)
int cmd_step(const Args& args);       ///< terminal stepper for a trace (cmd_step.cpp)
int cmd_lesson(const Args& args);     ///< lessons: list, show, hint, check, answer (cmd_lesson.cpp)
int cmd_attention(const Args& args);  ///< attention reference fwd/bwd (cmd_attention.cpp)
bool attention_device_given(const Args& args);  ///< `attention ... --device X` given (cmd_attention_cuda.cpp)
int cmd_attention_device(const Args& args);     ///< `attention ... --device cpu|cuda` (cmd_attention_cuda.cpp)
int cmd_traffic(const Args& args);    ///< traffic sweeps naive vs FA1 vs FA2 (cmd_traffic.cpp)
int cmd_mta(const Args& args);        ///< Multi-Token Attention reference (cmd_mta.cpp)
int cmd_traffic_mta(const Args& args);  ///< MTA traffic, modelled and measured on CUDA (cmd_mta_cuda.cpp)
bool mta_device_given(const Args& args);  ///< `mta ... --device X` given (cmd_mta_cuda.cpp)
int cmd_mta_device(const Args& args);     ///< `mta ... --device cpu|cuda` (cmd_mta_cuda.cpp)
int cmd_stream(const Args& args);     ///< STREAM sparse tracing reference (cmd_stream.cpp)
int cmd_stream_cuda(const Args& args);     ///< `stream … --device cuda`, the GPU kernels (cmd_stream_cuda.cpp)
int cmd_stream_needles(const Args& args);  ///< `stream needles`, planted-needle recall (cmd_stream_cuda.cpp)
bool stream_wants_cuda(const Args& args);  ///< true when the stream arguments say --device cuda
int cmd_traffic_ring(const Args& args);    ///< `traffic ring`, bytes between GPUs of context-parallel attention (attention/cmd_traffic_ring.cpp)
int cmd_traffic_stream(const Args& args);  ///< `traffic stream --device cuda` (cmd_stream_cuda.cpp)
int cmd_traffic_shards(const Args& args);  ///< `traffic stream-shards`, STREAM over G simulated GPUs (stream/cmd_traffic_shards.cpp)
int cmd_demo(const Args& args);       ///< the main job on its embedded default (cmd_demo.cpp)
int cmd_bench(const Args& args);      ///< `bench attention`, GPU timing of the fast forward and backward; dispatches mta and stream (cmd_bench.cpp)
int cmd_bench_mta(const Args& args);  ///< GPU timing of the MTA kernels, `bench mta` (cmd_bench_mta.cpp)
int cmd_bench_stream(const Args& args);  ///< `bench stream`, GPU timing of STREAM (cmd_bench_stream.cpp)

}  // namespace flashlab::app
