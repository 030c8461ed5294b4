// `flashlab attention fwd|bwd --device cpu|cuda`: --device cpu hands the other flags to the CPU
// reference command (cmd_attention.cpp); --device cuda runs the CUDA kernels on the same inputs —
// seeded as the CPU command seeds them, or q.npy k.npy v.npy [do.npy] from --inputs — and
// compares them with the naive float64 reference. Parsing, checks and printing only: the kernels
// are cuda/'s (fast_attention.hpp, attention.hpp), the reference is reference/'s.
//
// Every flag and input check runs before any CUDA call and says what the CPU command says for
// the same input (input_checks.hpp, attention_flags.hpp), in any build; a build without CUDA then
// refuses a valid command line with the usual hint.
#include "attention/attention_flags.hpp"
#include "core/commands.hpp"
#include "core/gpu_flags.hpp"
#include "core/input_checks.hpp"
#include "core/report.hpp"
#include "core/shared_flags.hpp"

#include "flashlab/reference/attention.hpp"
#include "flashlab/reference/npy.hpp"
#include "flashlab/reference/tensor.hpp"

#ifdef FLASHLAB_HAVE_CUDA
#include "flashlab/cuda/attention.hpp"
#include "flashlab/cuda/fast_attention.hpp"
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace flashlab::app {

namespace {

namespace fs = std::filesystem;
using ref::AttentionProblem;
using ref::Shape;
using ref::Tensor;

constexpr const char* kUsageLine =
    "attention fwd|bwd --device cuda [--kernel fast|clear] [--dtype bf16|fp16] [--seq N --dim D]\n"
    "                          [--heads H] [--heads-kv HKV] [--seq-k NK] [--batch B] [--causal] [--window L,R]\n"
    "                          [--cu-seqlens FILE]\n"
    "                          [--scale X] [--seed S] [--inputs DIR] [--save DIR] [--bwd-kernel K] [--allow-nonfinite]\n"
    "                          [--memory-limit SIZE] [--json|--csv]";
constexpr const char* kSummary =
    "Attention on the GPU, on the CPU command's inputs: seeded (the same values for the same --seed)\n"
    "or q.npy k.npy v.npy [do.npy] from --inputs DIR ([N, H, D] or [B, N, H, D], float32 or float64).\n"
    "--kernel fast runs the fast tensor-core kernels, the fastest this GPU has (the Hopper TMA kernels\n"
    "on an H100/H200): Q, K, V (dO) rounded to --dtype (bf16 or fp16; the reference gets the rounded\n"
    "values), d = 64, 128 or 256. fwd prints O's error against the naive float64 reference\n"
    "(max |gpu - ref| / max |ref|) beside 2x the rounding floor, the error of merely rounding the\n"
    "float64 O to the dtype: it must stay within it and 1e-2 (when the logit bound exceeds 64, rows can\n"
    "be one-hot and P's own rounding adds two units of the dtype to the bound); LSE within 1e-4. bwd\n"
    "runs the fast forward for O and LSE, then the fastest backward (or --bwd-kernel), and prints dQ,\n"
    "dK, dV beside 2x their floors (tolerance max(1e-2, 2x floor) + 2^-24 L: the backward forms P's\n"
    "exponent as fma(S, scale log2 e, -LSE), and the fp32 LSE has lost the part of S scale log2 e\n"
    "below half a unit, 2^-24 of the logit bound L = scale max|q| max|k|; rounding the product first,\n"
    "as the forward rounds m_i, removes that error but costs the backward 2-4% at d = 64 on an H100,\n"
    "see docs/cuda.md). --kernel clear (the default) runs the clear fp32 kernels (fa2 forward, two-kernel\n"
    "backward) against the float32 tolerance of the CPU command. fwd --kernel fast also takes grouped\n"
    "K/V (--heads-kv HKV dividing H: query head h reads K/V head h/(H/HKV)) and --seq-k NK != N\n"
    "(causal bottom-right aligned: query i sees key j iff j <= i + NK - N; a row that sees no key\n"
    "gives O = 0, LSE = -inf, dQ = 0) and --window L,R (query i sees key j iff i + NK - N - L <= j <=\n"
    "i + NK - N + R, -1 unbounded, causal caps R at 0: the CPU command's rule); bwd --kernel fast\n"
    "takes all three on the mma and wgmma-ws backward kernels (dK, dV of K's shape; wgmma-ws-det\n"
    "refuses them at d = 64 and 128); the clear kernels take HKV = H, NK = N and no window.\n"
    "--kernel fast also takes d = 256: fwd on the mma and tma-ws forwards, bwd on the mma, wgmma-ws\n"
    "and wgmma-ws-det kernels (the last bit-reproducible, grouped K/V, NK != N and windows too).\n"
    "fwd and bwd --kernel fast also take --cu-seqlens FILE, packed variable-length sequences in the\n"
    "CPU command's file format (a line 'cu_seqlens_q = 0 3 3 10', and 'cu_seqlens_k = ...' when the\n"
    "keys differ; its sequences replace --seq, --seq-k and --batch): Q [total_q, H, D], each sequence\n"
    "with its own mask (the diagonal bottom-right aligned at len_k - len_q), the lists in device\n"
    "memory (d = 64 and 128; bwd on the mma and wgmma-ws backward kernels, wgmma-ws-det refuses them).\n"
    "--save DIR writes o.npy lse.npy [dq.npy dk.npy dv.npy] as float32. Exit 0 within tolerance, 1\n"
    "when not, 2 on bad input. --device cpu runs the CPU reference command instead.\n"
    "--json and --csv print the CPU command's fields where they mean the same (command, variant,\n"
    "precision, config, error_metric, errors, tolerance, tolerance_logit_bound, nan, within_tolerance,\n"
    "ok) and the GPU's own: device, device_name, kernel, the kernels run, each output's bound, how it\n"
    "was made, its rounding floor (--kernel fast) and verdict, and where --save wrote.";

// The sizes the CPU command accepts (its flags' ranges): the naive float64 reference holds
// N x N scores, so N stays at most 8192 here too.
constexpr long long kMaxSeq = 8192, kMaxDim = 1024, kMaxHeads = 1024, kMaxBatch = 1024;

po::options_description options() {
  po::options_description d("Options");
  d.add_options()("help,h", "show this help")
      ("device", po::value<std::string>(), "cuda (this command) | cpu (the CPU reference command)")
      ("kernel", po::value<std::string>()->default_value("clear"),
       "fast | clear: the fast tensor-core kernels, or the clear fp32 kernels (the default)")
      ;
  add_dtype_option(d, "bf16 | fp16", "bf16", " (--kernel fast; the clear kernels are fp32)");
  d.add_options()
      ("seq", po::value<long long>(), "N, sequence length (1..8192; from q.npy with --inputs)")
      ("seq-k", po::value<long long>(), "N_k, key/value length (--kernel fast only, when it differs from N)")
      ("heads", po::value<long long>()->default_value(1), "H, number of heads")
      ("heads-kv", po::value<long long>(), "H_kv, K/V heads dividing H (--kernel fast only; default H)")
      ;
  add_dim_option(d, " (--kernel fast: 64, 128 or 256; from q.npy with --inputs)");
  d.add_options()
      ("batch", po::value<long long>()->default_value(1), "B, batch size")
      ("causal", po::bool_switch(), "causal mask")
      ;
  add_window_option(d, " (--kernel fast only)");
  d.add_options()
      ("cu-seqlens", po::value<std::string>(),
       "FILE with cu_seqlens_q (and cu_seqlens_k): packed variable-length sequences (--kernel fast only; - "
       "reads standard input)")
      ("scale", po::value<double>(), "softmax scale (default 1/sqrt(d))")
      ;
  add_seed_option(d);
  d.add_options()
      ("inputs", po::value<std::string>(), "directory with q.npy k.npy v.npy [do.npy]")
      ("save", po::value<std::string>(), "directory to write o.npy lse.npy [dq.npy dk.npy dv.npy]")
      ("bwd-kernel", po::value<std::string>()->default_value("auto"),
       "bwd --kernel fast: auto | mma | wgmma-ws | wgmma-ws-det, the kernel of the atomic backward (auto: "
       "the fastest this GPU runs)");
  add_input_options(d);
  add_output_options(d);
  return d;
}

// One run: mode, kernel, problem and float64 inputs.
struct Run {
  std::string mode;
  bool fast = false;
  ref::Dtype dtype16 = ref::Dtype::bf16;  // --kernel fast's inputs
  std::string bwd_kernel = "auto";        // --bwd-kernel
  AttentionProblem cfg;
  bool four_d = false;                     // save [B, N, H, D] (inputs had a batch, or --batch > 1)
  std::optional<fs::path> save;
  InputPolicy policy;
  Tensor<double> Q, K, V, dO;
};

// ---- inputs: the CPU command's rules and messages (attention_flags.hpp) -------------------------

long long get_ll(const po::variables_map& vm, const char* name) { return vm[name].as<long long>(); }

// What the run holds at its peak: the float64 operands, their rounded copies and outputs, and the
// naive reference's N x N_k scores of one head (S, P; backward also dP, dS).
void require_memory(const Run& run) {
  const bool bwd = run.mode == "bwd";
  const Shape q = run.cfg.q_shape(), kv = run.cfg.kv_shape();
  MemoryPlan plan;
  const std::uint64_t qn = checked_size({q.batch, q.seq, q.heads, q.head_dim}, "Q's element count");
  const std::uint64_t kvn = checked_size({kv.batch, kv.seq, kv.heads, kv.head_dim}, "K's element count");
  plan.add("Q, O, dO (float64 inputs and reference)", qn, 8, bwd ? 4 : 2);
  plan.add("K, V (float64 inputs)", kvn, 8, 2);
  plan.add("rounded copies and outputs", qn + kvn * 2, 8, bwd ? 3 : 2);
  // Packed: the reference runs one sequence at a time, the longest at most.
  plan.add("naive N x N_k scores of one head", checked_size({run.cfg.n_q(), run.cfg.n_k()}, "N x N_k"), 8, bwd ? 4 : 2);
  plan.require_within(run.policy, "attention " + run.mode + " on Q " + q.str() + ", K " + kv.str());
}

// The flags and the inputs, every check before any CUDA call.
Run parse_run(const po::variables_map& vm) {
  Run run;
  if (!vm.count("mode")) throw UsageError("missing the mode: fwd or bwd", "e.g. flashlab attention fwd --seq 128 --dim 64");
  run.mode = vm["mode"].as<std::string>();
  if (run.mode != "fwd" && run.mode != "bwd") throw UsageError("unknown mode '" + run.mode + "'", "the mode is fwd or bwd");
  const bool bwd = run.mode == "bwd";
  run.fast = kernel_family(vm["kernel"].as<std::string>(), KernelFamily::clear) == KernelFamily::fast;
  run.dtype16 = fp16_dtype(vm["dtype"].as<std::string>()) ? ref::Dtype::fp16 : ref::Dtype::bf16;
  if (!run.fast && !vm["dtype"].defaulted())
    throw UsageError("--dtype applies to --kernel fast", "the clear kernels compute in fp32; add --kernel fast");
  run.bwd_kernel = bwd_kernel_flag(vm["bwd-kernel"].as<std::string>());
  if (!vm["bwd-kernel"].defaulted() && (!run.fast || !bwd))
    throw UsageError("--bwd-kernel applies to bwd --kernel fast", "add --kernel fast, or drop --bwd-kernel");
  require_range("heads", get_ll(vm, "heads"), 1, kMaxHeads);
  require_range("batch", get_ll(vm, "batch"), 1, kMaxBatch);
  run.cfg.causal = vm["causal"].as<bool>();
  const unsigned long long seed = checked_seed(get_ll(vm, "seed"));
  run.policy = input_policy(vm);
  if (const auto s = checked_scale(vm)) run.cfg.scale = *s;
  if (vm.count("save")) run.save = prepare_save_dir(vm["save"].as<std::string>());

  if (vm.count("inputs")) {
    if (vm.count("cu-seqlens"))
      throw UsageError("--cu-seqlens with --inputs runs on the CPU reference only",
                       "add --device cpu, or drop --inputs to run seeded packed inputs on the GPU");
    const fs::path dir(vm["inputs"].as<std::string>());
    if (!fs::is_directory(dir)) throw UsageError("--inputs " + dir.string() + " is not a directory", "give a directory holding q.npy k.npy v.npy");
    const fs::path qf = dir / "q.npy", kf = dir / "k.npy", vf = dir / "v.npy", df = dir / "do.npy";
    const bool have_do = bwd && fs::exists(df);
    const AttentionOperand q_shape = attention_operand_shape(qf), k_shape = attention_operand_shape(kf),
                           v_shape = attention_operand_shape(vf);
    if (have_do) attention_operand_shape(df);
    run.cfg.batch = q_shape.shape.batch;
    run.cfg.seq = q_shape.shape.seq;
    run.cfg.seq_k = k_shape.shape.seq == q_shape.shape.seq ? 0 : k_shape.shape.seq;
    run.cfg.heads = q_shape.shape.heads;
    run.cfg.head_dim = q_shape.shape.head_dim;
    run.four_d = q_shape.four_d;
    require_memory(run);
    run.Q = load_attention_operand(qf, run.policy);
    run.K = load_attention_operand(kf, run.policy);
    run.V = load_attention_operand(vf, run.policy);
    // One layout for all operands: a 4-D q beside 3-D k, v is a mistake, not a batch of one.
    for (const auto& [name, operand] : {std::pair{"k.npy", &k_shape}, std::pair{"v.npy", &v_shape}})
      if (operand->four_d != q_shape.four_d)
        throw UsageError(std::string(name) + " is " + (operand->four_d ? "4-D" : "3-D") + " but q.npy is " +
                             (q_shape.four_d ? "4-D" : "3-D"),
                         "give every operand the same layout: all [N, H, D] or all [B, N, H, D]");
    const Shape qs = run.Q.shape(), ks = run.K.shape(), vs = run.V.shape();
    // K and V may have fewer heads (grouped K/V, checked with the flags below) and their own length.
    constexpr const char* kLayout = "q and do are [B, N, H, D]; k and v are [B, N_k, H_kv, D] with the same B, D";
    require_operand_match(kf, "batch", ks.batch, qs.batch, "q.npy", kLayout);
    require_operand_match(kf, "head dim", ks.head_dim, qs.head_dim, "q.npy", kLayout);
    run.cfg.heads_kv = ks.heads == qs.heads ? 0 : ks.heads;
    require_operand_match(vf, "batch", vs.batch, ks.batch, "k.npy", kLayout);
    require_operand_match(vf, "sequence length", vs.seq, ks.seq, "k.npy", kLayout);
    require_operand_match(vf, "heads", vs.heads, ks.heads, "k.npy", kLayout);
    require_operand_match(vf, "head dim", vs.head_dim, ks.head_dim, "k.npy", kLayout);
    auto agree = [&](const char* flag, std::size_t file_value) {
      if (vm.count(flag) && !vm[flag].defaulted() && std::size_t(get_ll(vm, flag)) != file_value) {
        std::ostringstream m;
        m << "--" << flag << " " << get_ll(vm, flag) << " disagrees with " << qf.string() << " (" << file_value << ")";
        throw UsageError(m.str(), "with --inputs the sizes come from the files; drop the flag");
      }
    };
    agree("seq", qs.seq);
    agree("heads", qs.heads);
    agree("dim", qs.head_dim);
    agree("batch", qs.batch);
    if (vm.count("seq-k")) agree("seq-k", ks.seq);
    if (vm.count("heads-kv")) agree("heads-kv", ks.heads);
    if (have_do) {
      run.dO = load_attention_operand(df, run.policy);
      if (!(run.dO.shape() == qs)) throw UsageError(df.string() + ": shape differs from q.npy", "dO has the shape of Q (and O)");
    }
  } else if (vm.count("cu-seqlens")) {
    // The file's sequences replace --batch, --seq and --seq-k (the CPU command's rule).
    for (const char* flag : {"seq", "seq-k", "batch"})
      if (vm.count(flag) && !vm[flag].defaulted())
        throw UsageError(std::string("--") + flag + " conflicts with --cu-seqlens",
                         std::string("with packed sequences the lengths come from the file; drop --") + flag);
    if (!run.fast)
      throw UsageError("--cu-seqlens: the clear kernels take none",
                       "run packed sequences with --kernel fast, or on the CPU reference: --device cpu");
    run.cfg.set_packed(read_cu_seqlens(vm["cu-seqlens"].as<std::string>()));
    run.cfg.heads = std::size_t(get_ll(vm, "heads"));
    if (vm.count("heads-kv")) {
      require_range("heads-kv", get_ll(vm, "heads-kv"), 1, kMaxHeads);
      run.cfg.heads_kv = std::size_t(get_ll(vm, "heads-kv"));
    }
  } else {
    if (!vm.count("seq")) throw UsageError("--seq is required", "e.g. --seq 128 (or --inputs DIR, or --cu-seqlens FILE)");
    run.cfg.batch = std::size_t(get_ll(vm, "batch"));
    run.cfg.heads = std::size_t(get_ll(vm, "heads"));
    if (vm.count("heads-kv")) {
      require_range("heads-kv", get_ll(vm, "heads-kv"), 1, kMaxHeads);
      run.cfg.heads_kv = std::size_t(get_ll(vm, "heads-kv"));
    }
    run.four_d = run.cfg.batch > 1;
  }
  if (vm.count("seq")) {
    require_range("seq", get_ll(vm, "seq"), 1, kMaxSeq);
    run.cfg.seq = std::size_t(get_ll(vm, "seq"));
  }
  if (vm.count("dim") && !(vm.count("inputs") && vm["dim"].defaulted())) {  // with --inputs, d is q.npy's
    require_range("dim", get_ll(vm, "dim"), 1, kMaxDim);
    run.cfg.head_dim = std::size_t(get_ll(vm, "dim"));
  }
  if (vm.count("seq-k")) {
    require_range("seq-k", get_ll(vm, "seq-k"), 1, kMaxSeq);
    run.cfg.seq_k = std::size_t(get_ll(vm, "seq-k"));
  }
  if (run.cfg.seq > std::size_t(kMaxSeq) || run.cfg.n_k() > std::size_t(kMaxSeq))
    throw UsageError("sequence length " + std::to_string(std::max(run.cfg.seq, run.cfg.n_k())) + " is above 8192",
                     "the naive float64 reference materialises N x N scores; use a shorter sequence");
  window_flag(vm, run.cfg);
  validate_flags(run.cfg);

  // The kernels' own limits, as usage errors (checked in every build: no CUDA call needed). Grouped
  // K/V, N_k != N and windows: the fast kernels take them (the fast backward's front door checks
  // them by kernel: wgmma-ws-det refuses them at d = 64 and 128), the clear kernels do not.
  const char* const which = "the clear kernels take";
  const char* const where = "run it with --kernel fast, or on the CPU reference: --device cpu";
  if (!run.fast && run.cfg.n_k() != run.cfg.n_q())
    throw UsageError(std::string(vm.count("seq-k") ? "--seq-k " : "k.npy's N_k = ") + std::to_string(run.cfg.n_k()) +
                         " differs from N = " + std::to_string(run.cfg.n_q()) + ": " + which + " N_k = N",
                     where);
  if (!run.fast && run.cfg.has_window())
    throw UsageError("--window " + std::to_string(run.cfg.window_left) + "," + std::to_string(run.cfg.window_right) +
                         ": " + which + " no window",
                     where);
  if (!run.fast && run.cfg.h_kv() != run.cfg.heads)
    throw UsageError(std::string(vm.count("heads-kv") ? "--heads-kv " : "k.npy's H_kv = ") +
                         std::to_string(run.cfg.h_kv()) + " differs from H = " + std::to_string(run.cfg.heads) + ": " +
                         which + " H_kv = H",
                     where);
  if (run.fast)
    require_fast_dim(run.cfg.head_dim, run.cfg.is_packed(),
                     run.cfg.is_packed() ? "the CPU reference takes them at any d: --device cpu"
                                         : "--kernel clear takes any d up to 256");
  // The fixed-order kernel's limits, as bench attention states them, where the flags set the shape
  // (with --inputs the front door names the field).
  if (bwd && run.fast && run.bwd_kernel == "wgmma-ws-det" && !vm.count("inputs"))
    require_det_backward({{int(run.cfg.head_dim)}, {int(run.cfg.seq)}, run.cfg.heads,
                          run.cfg.h_kv(), run.cfg.is_packed() ? 0 : run.cfg.n_k(), run.cfg.window_left,
                          run.cfg.window_right, run.cfg.is_packed()},
                         "use --bwd-kernel auto, mma or wgmma-ws, or --dim 256",
                         "use --bwd-kernel auto, mma or wgmma-ws");
  if (!run.fast && run.cfg.head_dim > 256)
    throw UsageError("--dim " + std::to_string(run.cfg.head_dim) + " is above 256",
                     "the clear kernels keep whole rows of d in SRAM; use --dim 256 or less");

  if (!vm.count("inputs")) {
    require_memory(run);
    run.Q = Tensor<double>(run.cfg.q_shape());
    run.K = Tensor<double>(run.cfg.kv_shape());
    run.V = Tensor<double>(run.cfg.kv_shape());
    ref::fill_normal(run.Q, seed * 4 + 0);  // the CPU command's values for the same seed
    ref::fill_normal(run.K, seed * 4 + 1);
    ref::fill_normal(run.V, seed * 4 + 2);
  }
  if (bwd && run.dO.numel() == 0) {
    run.dO = Tensor<double>(run.cfg.q_shape());
    ref::fill_normal(run.dO, seed * 4 + 3);
  }
  return run;
}

#ifdef FLASHLAB_HAVE_CUDA
// ---- the GPU runs (CUDA builds only) ---------------------------------------------------------

namespace fc = flashlab::cuda;

// One printed error: the name, the error, the bound it must stay under and how the bound was made.
struct ErrorLine {
  std::string name;
  double error = 0;
  double bound = 0;
  std::string why;
};

// What ran, for --json / --csv: the reference's name of the algorithm (null where the kernel's
// design is not one of them), the kernels, and the rounding floors of the fast kernels' outputs
// (the error of merely rounding the float64 reference to the dtype).
struct Kernels {
  std::optional<ref::Algorithm> variant;
  std::string forward, backward;  // backward empty for fwd
  std::vector<std::pair<std::string, double>> floors;
};

double logit_bound(const Run& run);

// --json / --csv: the CPU command's keys where the quantity is the same (cmd_attention.cpp), so a
// script reads the same fields on either device, then the GPU's own. `tolerance` is the one bound
// when every output has the same (the clear kernels), else null: see `tolerances`.
void print_report(const Run& run, OutputFormat format, const Kernels& kernels, const std::vector<ErrorLine>& lines) {
  const AttentionProblem& c = run.cfg;
  ReportOutput report(format, std::cout);
  Json& j = report.json();
  bool nan = false, within = true, one_bound = true;
  for (const auto& l : lines) {
    nan = nan || std::isnan(l.error);
    within = within && l.error <= l.bound;  // NaN fails
    one_bound = one_bound && l.bound == lines.front().bound;
  }
  j.begin_object();
  j.key("command").value("attention " + run.mode);
  j.key("variant");
  if (kernels.variant) j.value(ref::algorithm_name(*kernels.variant));
  else j.null();
  j.key("precision").value("float");  // fp32 arithmetic on either kernel family
  j.key("config").begin_object();
  j.key("batch").value(std::uint64_t(c.batch)).key("seq").value(std::uint64_t(c.n_q()));
  j.key("seq_k").value(std::uint64_t(c.n_k())).key("heads").value(std::uint64_t(c.heads));
  j.key("heads_kv").value(std::uint64_t(c.h_kv()));
  j.key("window_left").value(std::int64_t(c.window_left)).key("window_right").value(std::int64_t(c.window_right));
  j.key("packed").value(c.is_packed());
  j.key("head_dim").value(std::uint64_t(c.head_dim)).key("causal").value(c.causal);
  j.key("scale").value(c.softmax_scale()).key("dtype").value(ref::dtype_name(run.fast ? run.dtype16 : ref::Dtype::fp32));
  j.end_object();
  j.key("error_metric").value("max|got-ref|/max|ref| against naive float64");
  j.key("errors").begin_object();
  for (const auto& l : lines) j.key(l.name).value(l.error);  // NaN → null
  j.end_object();
  j.key("tolerance");
  if (one_bound && !lines.empty()) j.value(lines.front().bound);
  else j.null();
  j.key("tolerance_logit_bound").value(logit_bound(run));
  j.key("nan").value(nan).key("within_tolerance").value(within);
  j.key("ok").value(within);
  j.key("device").value("cuda").key("device_name").value(fc::device_description());
  j.key("kernel").value(run.fast ? "fast" : "clear");
  j.key("forward_kernel").value(kernels.forward);
  if (!kernels.backward.empty()) j.key("backward_kernel").value(kernels.backward);
  j.key("tolerances").begin_object();
  for (const auto& l : lines) j.key(l.name).value(l.bound);
  j.end_object();
  j.key("bounds").begin_object();
  for (const auto& l : lines) j.key(l.name).value(l.why);
  j.end_object();
  if (run.fast) {
    j.key("floors").begin_object();
    for (const auto& [name, floor] : kernels.floors) j.key(name).value(floor);
    j.end_object();
  }
  j.key("within").begin_object();
  for (const auto& l : lines) j.key(l.name).value(l.error <= l.bound);
  j.end_object();
  j.key("saved");
  if (run.save) j.value(run.save->string());
  else j.null();
  j.end_object();
  report.finish();
}

int report(const Run& run, OutputFormat format, const Kernels& kernels, const std::string& title,
           const std::vector<ErrorLine>& lines) {
  if (format != OutputFormat::text) {
    print_report(run, format, kernels, lines);
    for (const auto& l : lines)
      if (!(l.error <= l.bound)) {
        std::cerr << "error: the GPU result does not match the float64 reference (see above)\n";
        return kFailed;
      }
    return kOk;
  }
  const AttentionProblem& c = run.cfg;
  std::cout << "flashlab attention " << run.mode << " --device cuda --kernel " << (run.fast ? "fast" : "clear") << ": "
            << fc::device_description() << "\n"
            << (c.packed ? std::to_string(c.batch) + " packed sequences (total_q=" + std::to_string(c.packed->total_q()) +
                               " total_k=" + std::to_string(c.packed->total_k()) + "), longest "
                         : "B=" + std::to_string(c.batch) + " ")
            << "N=" << c.seq << (c.n_k() != c.seq ? " N_k=" + std::to_string(c.n_k()) : "")
            << " H=" << c.heads << (c.h_kv() != c.heads ? " H_kv=" + std::to_string(c.h_kv()) : "")
            << " d=" << c.head_dim << (c.causal ? " causal" : "")
            << (c.has_window() ? " window=" + std::to_string(c.window_left) + "," + std::to_string(c.window_right) : "")
            << " scale " << c.softmax_scale() << ", " << title
            << "\n"
            << "max error vs naive float64 on the " << (run.fast ? "rounded " : "") << "inputs (max |gpu - ref| / max |ref|):\n";
  bool ok = true;
  for (const auto& l : lines) {
    const bool within = l.error <= l.bound;  // NaN fails
    ok = ok && within;
    char line[320];
    std::snprintf(line, sizeof line, "  %-4s %.2e  %-6s (bound %.2e: %s)\n", l.name.c_str(), l.error,
                  within ? "ok" : "FAILED", l.bound, l.why.c_str());
    std::cout << line;
  }
  if (run.save) std::cout << "saved to " << run.save->string() << "\n";
  if (!ok) {
    std::cerr << "error: the GPU result does not match the float64 reference (see above)\n";
    return kFailed;
  }
  return kOk;
}

void save_tensor(const Run& run, const char* name, const Tensor<float>& t) {
  const Shape& s = t.shape();
  std::vector<std::size_t> shape = {s.seq, s.heads, s.head_dim};
  if (run.four_d) shape.insert(shape.begin(), s.batch);
  ref::write_npy(*run.save / name, shape, t.data());
}
void save_stats(const Run& run, const std::vector<float>& lse) {
  // [H, N] per batch entry; packed [H, total_q].
  std::vector<std::size_t> shape = {run.cfg.heads, run.cfg.stat_numel() / (run.cfg.heads * run.cfg.q_shape().batch)};
  if (run.four_d) shape.insert(shape.begin(), run.cfg.batch);
  ref::write_npy(*run.save / "lse.npy", shape, lse.data());
}

// Logit bound scale·max‖q_i‖·max‖k_j‖: beyond kCalibratedLogitBound rows can be one-hot.
double logit_bound(const Run& run) {
  const std::size_t d = run.cfg.head_dim;
  return run.cfg.softmax_scale() * max_row_norm(run.Q.data(), run.Q.numel() / d, d) *
         max_row_norm(run.K.data(), run.K.numel() / d, d);
}

// --kernel fast: 16-bit inputs (bit patterns), the fastest kernels of this GPU.
int run_fast(Run& run, OutputFormat format) {
  const bool bf16 = run.dtype16 == ref::Dtype::bf16;
  auto to16 = [&](float f) { return bf16 ? fc::float_to_bf16(f) : fc::float_to_fp16(f); };
  auto from16 = [&](std::uint16_t b) { return bf16 ? fc::bf16_to_float(b) : fc::fp16_to_float(b); };
  // Rounds `x` to the dtype in place (the reference sees what the kernels see), returns the bits.
  auto round_in_place = [&](Tensor<double>& x) {
    std::vector<std::uint16_t> bits(x.numel());
    for (std::size_t i = 0; i < bits.size(); ++i) x.data()[i] = from16(bits[i] = to16(float(x.data()[i])));
    return bits;
  };
  auto widen = [&](const std::vector<std::uint16_t>& bits, const Shape& s) {
    Tensor<float> t(s);
    for (std::size_t i = 0; i < bits.size(); ++i) t.data()[i] = from16(bits[i]);
    return t;
  };
  // The floor of a 16-bit output: the float64 result merely rounded to the dtype.
  auto floor_of = [&](const Tensor<double>& want) {
    std::vector<float> r(want.numel());
    for (std::size_t i = 0; i < r.size(); ++i) r[i] = from16(to16(float(want.data()[i])));
    return ref::max_error_vs_max(r.data(), want.data(), r.size());
  };
  AttentionProblem cfg = run.cfg;
  cfg.dtype = run.dtype16;
  try {
    fc::check_fast_problem(cfg);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what(), "what --kernel fast takes: flashlab attention --device cuda --help");
  }
  const auto Qb = round_in_place(run.Q), Kb = round_in_place(run.K), Vb = round_in_place(run.V);
  const fc::FastForwardKernel fwd_kernel = fc::fastest_forward_kernel(cfg);
  const auto fwd = fc::fast_attention_forward(cfg, fwd_kernel, Qb, Kb, Vb);
  const Tensor<float> O = widen(fwd.O, cfg.q_shape());
  const double u = bf16 ? 0x1p-8 : 0x1p-11;  // unit roundoff of the dtype
  const double L = logit_bound(run);
  std::vector<ErrorLine> lines;
  std::string title = std::string(ref::dtype_name(cfg.dtype)) + " inputs, fp32 accumulation, forward kernel " +
                      fc::to_string(fwd_kernel);
  Kernels kernels{std::nullopt, fc::to_string(fwd_kernel), {}, {}};
  if (run.mode == "fwd") {
    const auto want = ref::naive_forward<double>(cfg, run.Q, run.K, run.V);
    const double floor = floor_of(want.O);
    // One-hot rows (large logits): P is rounded to the dtype while l_i is not, then O again.
    const double p_rounding = L > kCalibratedLogitBound ? 2 * u : 0.0;
    const double bound = std::min(1e-2, 2 * floor + p_rounding + 1e-7);
    char why[160];
    std::snprintf(why, sizeof why, "2 x the rounding floor %.2e%s, at most 1e-2", floor,
                  p_rounding > 0 ? " + 2 units of the dtype (logit bound above 64)" : "");
    lines.push_back({"O", ref::max_error_vs_max(O.data(), want.O.data(), O.numel()), bound, why});
    kernels.floors.emplace_back("O", floor);
    lines.push_back({"LSE", ref::max_error_vs_max(fwd.LSE.data(), want.LSE.data(), fwd.LSE.size()), 1e-4,
                     "fp32 statistics"});
  } else {
    const std::vector<std::uint16_t> dOb = round_in_place(run.dO);
    const fc::FastBackwardKernel bwd_kernel = run.bwd_kernel == "mma"            ? fc::FastBackwardKernel::mma_sync
                                              : run.bwd_kernel == "wgmma-ws"     ? fc::FastBackwardKernel::wgmma_ws
                                              : run.bwd_kernel == "wgmma-ws-det" ? fc::FastBackwardKernel::wgmma_ws_deterministic
                                                                                 : fc::fastest_backward_kernel(cfg);
    title += ", backward kernel " + std::string(fc::to_string(bwd_kernel));
    kernels.variant = ref::Algorithm::bwd_atomic;
    kernels.backward = fc::to_string(bwd_kernel);
    const auto g = fc::fast_attention_backward(ref::Algorithm::bwd_atomic, cfg, Qb, Kb, Vb, fwd.O, dOb, fwd.LSE, bwd_kernel);
    const auto want = ref::naive_backward<double>(cfg, run.Q, run.K, run.V, run.dO);
    const std::pair<const char*, const std::vector<std::uint16_t>*> got[] = {{"dQ", &g.dQ}, {"dK", &g.dK}, {"dV", &g.dV}};
    const Tensor<double>* wants[] = {&want.dQ, &want.dK, &want.dV};
    // The backward recomputes P = 2^(S·scale·log2 e − LSE) with one fused multiply-add, exact but
    // for LSE, which the forward rounded to fp32 after its m_i = fl(rowmax(S)·scale·log2 e) had
    // dropped the product's residual: P carries a relative error up to 2^-24·L, which the gradients
    // inherit (negligible for ordinary inputs; at L ~ 1e6 a one-hot row's weight is off by up to
    // tens of percent). Rounding the product first removes it, at one more fp32 operation per score
    // (measured: docs/cuda.md), so the bound carries the term instead.
    const double lse_rounding = 0x1p-24 * L;
    for (int t = 0; t < 3; ++t) {
      const Tensor<float> x = widen(*got[t].second, wants[t]->shape());
      const double floor = floor_of(*wants[t]), err = ref::max_error_vs_max(x.data(), wants[t]->data(), x.numel());
      char why[200];
      std::snprintf(why, sizeof why,
                    "max(1e-2, 2 x the rounding floor %.2e) + 2^-24 x the logit bound %.3g (the fp32 LSE); %.1f x the floor",
                    floor, L, floor > 0 ? err / floor : 0.0);
      lines.push_back({got[t].first, err, std::max(1e-2, 2 * floor) + lse_rounding, why});
      kernels.floors.emplace_back(got[t].first, floor);
    }
    if (run.save) {
      save_tensor(run, "dq.npy", widen(g.dQ, cfg.q_shape()));
      save_tensor(run, "dk.npy", widen(g.dK, cfg.kv_shape()));
      save_tensor(run, "dv.npy", widen(g.dV, cfg.kv_shape()));
    }
  }
  if (run.save) {
    save_tensor(run, "o.npy", O);
    save_stats(run, fwd.LSE);
  }
  return report(run, format, kernels, title, lines);
}

// --kernel clear: fp32 inputs, the fa2 forward and the two-kernel backward.
int run_clear(Run& run, OutputFormat format) {
  AttentionProblem cfg = run.cfg;
  cfg.dtype = ref::Dtype::fp32;
  const ref::Algorithm fwd_alg = ref::Algorithm::fa2_fwd, bwd_alg = ref::Algorithm::bwd_two_kernel;
  try {
    fc::check_clear_problem(run.mode == "fwd" ? fwd_alg : bwd_alg, cfg);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what(), "the clear kernels take d up to 256 and N_k = N");
  }
  // The kernels get fp32; the reference gets exactly those values in float64.
  const Tensor<float> Q = run.Q.cast<float>(), K = run.K.cast<float>(), V = run.V.cast<float>();
  run.Q = Q.cast<double>(), run.K = K.cast<double>(), run.V = V.cast<double>();
  const Tolerance tol = conditioned_tolerance(1e-5, logit_bound(run));
  const auto fwd = fc::attention_forward(fwd_alg, cfg, Q, K, V);
  std::vector<ErrorLine> lines;
  if (run.mode == "fwd") {
    const auto want = ref::naive_forward<double>(cfg, run.Q, run.K, run.V);
    lines.push_back({"O", ref::max_error_vs_max(fwd.O.data(), want.O.data(), fwd.O.numel()), tol.value, tol.str()});
    lines.push_back({"LSE", ref::max_error_vs_max(fwd.LSE.data(), want.LSE.data(), fwd.LSE.size()), tol.value, tol.str()});
  } else {
    const Tensor<float> dO = run.dO.cast<float>();
    run.dO = dO.cast<double>();
    const auto g = fc::attention_backward(bwd_alg, cfg, Q, K, V, fwd.O, dO, fwd.LSE);
    const auto want = ref::naive_backward<double>(cfg, run.Q, run.K, run.V, run.dO);
    lines.push_back({"dQ", ref::max_error_vs_max(g.dQ.data(), want.dQ.data(), g.dQ.numel()), tol.value, tol.str()});
    lines.push_back({"dK", ref::max_error_vs_max(g.dK.data(), want.dK.data(), g.dK.numel()), tol.value, tol.str()});
    lines.push_back({"dV", ref::max_error_vs_max(g.dV.data(), want.dV.data(), g.dV.numel()), tol.value, tol.str()});
    if (run.save) {
      save_tensor(run, "dq.npy", g.dQ);
      save_tensor(run, "dk.npy", g.dK);
      save_tensor(run, "dv.npy", g.dV);
    }
  }
  if (run.save) {
    save_tensor(run, "o.npy", fwd.O);
    save_stats(run, fwd.LSE);
  }
  const bool bwd = run.mode == "bwd";
  const Kernels kernels{bwd ? bwd_alg : fwd_alg, std::string(ref::algorithm_name(fwd_alg)),
                        bwd ? std::string(ref::algorithm_name(bwd_alg)) : std::string(), {}};
  return report(run, format, kernels, "fp32 clear kernels (fa2 forward, two-kernel backward)", lines);
}
#endif

int run_attention_cuda(const Args& args) {
  const auto desc = options();
  po::options_description all, hidden;
  hidden.add_options()("mode", po::value<std::string>(), "fwd | bwd");
  all.add(desc).add(hidden);
  po::positional_options_description pos;
  pos.add("mode", 1);
  const auto vm = parse(args, all, &pos);
  if (vm.count("help")) {
    print_help(std::cout, kUsageLine, kSummary, desc);
    return kOk;
  }
  const OutputFormat format = output_format(vm);
  Run run = parse_run(vm);
#ifdef FLASHLAB_HAVE_CUDA
  require_gpu("attention " + run.mode + " --device cuda");
  return run.fast ? run_fast(run, format) : run_clear(run, format);
#else
  (void)run;
  (void)format;
  throw built_without_cuda("--device cuda", "use --device cpu for the CPU reference");
#endif
}

}  // namespace

bool attention_device_given(const Args& args) { return !device_flag(args).empty(); }

int cmd_attention_device(const Args& args) {
  return dispatch_device(args, "attention", cmd_attention, run_attention_cuda);
}

}  // namespace flashlab::app
