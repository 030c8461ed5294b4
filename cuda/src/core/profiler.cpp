// CUPTI Range Profiler wrapper (profiler.hpp). The call sequence, verified on the H100 with
// CUDA 13's CUPTI (cupti_range_profiler.h, cupti_profiler_host.h): profiler initialise → chip name → counter
// availability → host object with the metrics → config image → per session: enable, counter
// data image, set config (auto range, kernel replay), start, kernels, stop, decode, evaluate
// each range, disable.
#include "flashlab/cuda/profiler.hpp"

#include "core/common.hpp"

#include <cuda.h>
#include <cupti_profiler_host.h>
#include <cupti_profiler_target.h>
#include <cupti_range_profiler.h>
#include <cupti_result.h>
#include <cupti_target.h>

#include <algorithm>
#include <array>
#include <stdexcept>
#include <dlfcn.h>
#include <initializer_list>
#include <sstream>

namespace flashlab::cuda {

namespace {

// CUPTI and the driver API are loaded at run time (dlopen), not linked: a binary linked against
// libcuda.so.1 / libcupti.so.13 would not even start on a machine without an NVIDIA driver, and the
// `flashlab` CLI and the GPU test binary must start there (CPU CI; a clean "skipped" message).
// Only the names' types come from the headers (decltype is unevaluated: no link dependency).
struct Api {
  decltype(&::cuptiDeviceGetChipName) cuptiDeviceGetChipName = nullptr;
  decltype(&::cuptiGetResultString) cuptiGetResultString = nullptr;
  decltype(&::cuptiProfilerGetCounterAvailability) cuptiProfilerGetCounterAvailability = nullptr;
  decltype(&::cuptiProfilerHostConfigAddMetrics) cuptiProfilerHostConfigAddMetrics = nullptr;
  decltype(&::cuptiProfilerHostDeinitialize) cuptiProfilerHostDeinitialize = nullptr;
  decltype(&::cuptiProfilerHostEvaluateToGpuValues) cuptiProfilerHostEvaluateToGpuValues = nullptr;
  decltype(&::cuptiProfilerHostGetConfigImage) cuptiProfilerHostGetConfigImage = nullptr;
  decltype(&::cuptiProfilerHostGetConfigImageSize) cuptiProfilerHostGetConfigImageSize = nullptr;
  decltype(&::cuptiProfilerHostGetNumOfPasses) cuptiProfilerHostGetNumOfPasses = nullptr;
  decltype(&::cuptiProfilerHostInitialize) cuptiProfilerHostInitialize = nullptr;
  decltype(&::cuptiProfilerInitialize) cuptiProfilerInitialize = nullptr;
  decltype(&::cuptiRangeProfilerCounterDataGetRangeInfo) cuptiRangeProfilerCounterDataGetRangeInfo = nullptr;
  decltype(&::cuptiRangeProfilerCounterDataImageInitialize) cuptiRangeProfilerCounterDataImageInitialize = nullptr;
  decltype(&::cuptiRangeProfilerDecodeData) cuptiRangeProfilerDecodeData = nullptr;
  decltype(&::cuptiRangeProfilerDisable) cuptiRangeProfilerDisable = nullptr;
  decltype(&::cuptiRangeProfilerEnable) cuptiRangeProfilerEnable = nullptr;
  decltype(&::cuptiRangeProfilerGetCounterDataInfo) cuptiRangeProfilerGetCounterDataInfo = nullptr;
  decltype(&::cuptiRangeProfilerGetCounterDataSize) cuptiRangeProfilerGetCounterDataSize = nullptr;
  decltype(&::cuptiRangeProfilerSetConfig) cuptiRangeProfilerSetConfig = nullptr;
  decltype(&::cuptiRangeProfilerStart) cuptiRangeProfilerStart = nullptr;
  decltype(&::cuptiRangeProfilerStop) cuptiRangeProfilerStop = nullptr;
  decltype(&::cuCtxGetCurrent) cuCtxGetCurrent = nullptr;
  decltype(&::cuGetErrorName) cuGetErrorName = nullptr;
};

void* open_first(std::initializer_list<const char*> names, std::string& tried) {
  for (const char* n : names) {
    if (void* h = dlopen(n, RTLD_NOW | RTLD_LOCAL)) return h;
    tried += std::string(" ") + n;
  }
  return nullptr;
}

template <typename F>
void load(void* lib, const char* name, F& fn) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (!fn) throw CudaError(std::string("CUPTI wrapper: symbol ") + name + " not found (" + dlerror() + ")");
}

const Api& api() {
  static const Api instance = [] {
    Api a;
    std::string tried;
    void* cupti = open_first({"libcupti.so.13", "libcupti.so"}, tried);
    if (!cupti)
      throw CudaError("CUPTI wrapper: cannot load" + tried +
                      " (hint: add the CUDA toolkit's lib directory, which holds CUPTI, to LD_LIBRARY_PATH)");
    void* driver = open_first({"libcuda.so.1", "libcuda.so"}, tried);
    if (!driver) throw CudaError("CUPTI wrapper: cannot load the CUDA driver library (tried" + tried + ")");
    load(cupti, "cuptiDeviceGetChipName", a.cuptiDeviceGetChipName);
    load(cupti, "cuptiGetResultString", a.cuptiGetResultString);
    load(cupti, "cuptiProfilerGetCounterAvailability", a.cuptiProfilerGetCounterAvailability);
    load(cupti, "cuptiProfilerHostConfigAddMetrics", a.cuptiProfilerHostConfigAddMetrics);
    load(cupti, "cuptiProfilerHostDeinitialize", a.cuptiProfilerHostDeinitialize);
    load(cupti, "cuptiProfilerHostEvaluateToGpuValues", a.cuptiProfilerHostEvaluateToGpuValues);
    load(cupti, "cuptiProfilerHostGetConfigImage", a.cuptiProfilerHostGetConfigImage);
    load(cupti, "cuptiProfilerHostGetConfigImageSize", a.cuptiProfilerHostGetConfigImageSize);
    load(cupti, "cuptiProfilerHostGetNumOfPasses", a.cuptiProfilerHostGetNumOfPasses);
    load(cupti, "cuptiProfilerHostInitialize", a.cuptiProfilerHostInitialize);
    load(cupti, "cuptiProfilerInitialize", a.cuptiProfilerInitialize);
    load(cupti, "cuptiRangeProfilerCounterDataGetRangeInfo", a.cuptiRangeProfilerCounterDataGetRangeInfo);
    load(cupti, "cuptiRangeProfilerCounterDataImageInitialize", a.cuptiRangeProfilerCounterDataImageInitialize);
    load(cupti, "cuptiRangeProfilerDecodeData", a.cuptiRangeProfilerDecodeData);
    load(cupti, "cuptiRangeProfilerDisable", a.cuptiRangeProfilerDisable);
    load(cupti, "cuptiRangeProfilerEnable", a.cuptiRangeProfilerEnable);
    load(cupti, "cuptiRangeProfilerGetCounterDataInfo", a.cuptiRangeProfilerGetCounterDataInfo);
    load(cupti, "cuptiRangeProfilerGetCounterDataSize", a.cuptiRangeProfilerGetCounterDataSize);
    load(cupti, "cuptiRangeProfilerSetConfig", a.cuptiRangeProfilerSetConfig);
    load(cupti, "cuptiRangeProfilerStart", a.cuptiRangeProfilerStart);
    load(cupti, "cuptiRangeProfilerStop", a.cuptiRangeProfilerStop);
    load(driver, "cuCtxGetCurrent", a.cuCtxGetCurrent);
    load(driver, "cuGetErrorName", a.cuGetErrorName);
    return a;
  }();
  return instance;
}

[[noreturn]] void throw_cupti(CUptiResult r, const char* expr, const char* file, int line) {
  const char* text = nullptr;
  api().cuptiGetResultString(r, &text);
  std::ostringstream os;
  os << "CUPTI error in " << expr << ": " << (text ? text : "unknown") << " (" << int(r) << ") at " << file << ":"
     << line;
  if (r == CUPTI_ERROR_INSUFFICIENT_PRIVILEGES)
    os << " (hint: performance counters need root or NVreg_RestrictProfilingToAdminUsers=0)";
  throw CudaError(os.str());
}

[[noreturn]] void throw_cu(CUresult r, const char* expr, const char* file, int line) {
  const char* name = nullptr;
  api().cuGetErrorName(r, &name);
  std::ostringstream os;
  os << "CUDA driver error in " << expr << ": " << (name ? name : "unknown") << " at " << file << ":" << line;
  throw CudaError(os.str());
}

// A CUPTI parameter struct, zeroed, with its structSize set (what `T p{SIZE}` does, without the
// missing-field-initializer warnings).
template <typename T>
T make_params(std::size_t size) {
  T p{};
  p.structSize = size;
  return p;
}

#define CUPTI_CHECK(expr)                                          \
  do {                                                             \
    CUptiResult r_ = (expr);                                       \
    if (r_ != CUPTI_SUCCESS) throw_cupti(r_, #expr, __FILE__, __LINE__); \
  } while (0)
#define CU_CHECK(expr)                                             \
  do {                                                             \
    CUresult r_ = (expr);                                          \
    if (r_ != CUDA_SUCCESS) throw_cu(r_, #expr, __FILE__, __LINE__); \
  } while (0)

// The metrics and the KernelCounters field each fills (sector counts × 32 bytes).
struct MetricDef {
  const char* name;
  double KernelCounters::*field;
  double factor;
};
constexpr MetricDef kMetrics[] = {
    {"dram__bytes_read.sum", &KernelCounters::dram_read_bytes, 1.0},
    {"dram__bytes_write.sum", &KernelCounters::dram_write_bytes, 1.0},
    {"l1tex__m_xbar2l1tex_read_bytes.sum", &KernelCounters::l2_read_bytes, 1.0},
    {"l1tex__m_l1tex2xbar_write_bytes.sum", &KernelCounters::l2_write_bytes, 1.0},
    {"lts__t_sectors_srcunit_tex_op_read.sum", &KernelCounters::lts_read_bytes, 32.0},
    {"lts__t_sectors_srcunit_tex_op_write.sum", &KernelCounters::lts_write_bytes, 32.0},
    {"lts__t_sectors_srcunit_tex_op_red.sum", &KernelCounters::l2_atomic_bytes, 32.0},
    {"lts__t_sectors_srcunit_tex_op_atom.sum", &KernelCounters::l2_atomic_bytes, 32.0},
    {"gpu__time_duration.sum", &KernelCounters::duration_ns, 1.0},
};

const MetricDef* find_metric(const std::string& name) {
  for (const auto& m : kMetrics)
    if (name == m.name) return &m;
  return nullptr;
}

}  // namespace

struct RangeProfiler::Impl {
  CUcontext ctx = nullptr;
  std::string chip;
  std::vector<std::uint8_t> availability;
  CUpti_Profiler_Host_Object* host = nullptr;
  std::vector<std::uint8_t> config;
  std::vector<const char*> metrics;  // accepted metrics
  std::vector<const MetricDef*> defs;  // their definitions
  std::vector<std::string> unavailable;
  std::size_t passes = 0;
};

std::vector<std::string> RangeProfiler::all_metrics() {
  std::vector<std::string> out;
  for (const auto& m : kMetrics) out.emplace_back(m.name);
  return out;
}

void RangeProfiler::accumulate(KernelCounters& to, const KernelCounters& from) {
  // Each field once (red and atom share l2_atomic_bytes).
  std::vector<double KernelCounters::*> done;
  for (const auto& m : kMetrics) {
    if (std::find(done.begin(), done.end(), m.field) != done.end()) continue;
    done.push_back(m.field);
    to.*(m.field) += from.*(m.field);
  }
  if (to.range_name.empty()) to.range_name = from.range_name;
}

RangeProfiler::RangeProfiler(const std::vector<std::string>& wanted) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  FLASHLAB_CUDA_CHECK(cudaSetDevice(0));
  FLASHLAB_CUDA_CHECK(cudaFree(nullptr));  // create the primary context
  CU_CHECK(api().cuCtxGetCurrent(&s.ctx));

  static bool initialised = false;  // cuptiProfilerInitialize once per process
  if (!initialised) {
    auto ip = make_params<CUpti_Profiler_Initialize_Params>(CUpti_Profiler_Initialize_Params_STRUCT_SIZE);
    CUPTI_CHECK(api().cuptiProfilerInitialize(&ip));
    initialised = true;
  }
  auto cp = make_params<CUpti_Device_GetChipName_Params>(CUpti_Device_GetChipName_Params_STRUCT_SIZE);
  cp.deviceIndex = 0;
  CUPTI_CHECK(api().cuptiDeviceGetChipName(&cp));
  s.chip = cp.pChipName;

  auto ap = make_params<CUpti_Profiler_GetCounterAvailability_Params>(CUpti_Profiler_GetCounterAvailability_Params_STRUCT_SIZE);
  ap.ctx = s.ctx;
  CUPTI_CHECK(api().cuptiProfilerGetCounterAvailability(&ap));
  s.availability.resize(ap.counterAvailabilityImageSize);
  ap.pCounterAvailabilityImage = s.availability.data();
  CUPTI_CHECK(api().cuptiProfilerGetCounterAvailability(&ap));

  auto hi = make_params<CUpti_Profiler_Host_Initialize_Params>(CUpti_Profiler_Host_Initialize_Params_STRUCT_SIZE);
  hi.profilerType = CUPTI_PROFILER_TYPE_RANGE_PROFILER;
  hi.pChipName = s.chip.c_str();
  hi.pCounterAvailabilityImage = s.availability.data();
  CUPTI_CHECK(api().cuptiProfilerHostInitialize(&hi));
  s.host = hi.pHostObject;

  // Add the metrics one at a time so that one the chip lacks is reported, not fatal.
  const std::vector<std::string> names = wanted.empty() ? all_metrics() : wanted;
  for (const std::string& n : names) {
    const MetricDef* def = find_metric(n);
    if (!def) throw std::invalid_argument("RangeProfiler: unknown metric '" + n + "' (see RangeProfiler::all_metrics())");
    const char* name = def->name;
    auto am = make_params<CUpti_Profiler_Host_ConfigAddMetrics_Params>(CUpti_Profiler_Host_ConfigAddMetrics_Params_STRUCT_SIZE);
    am.pHostObject = s.host;
    am.ppMetricNames = &name;
    am.numMetrics = 1;
    if (api().cuptiProfilerHostConfigAddMetrics(&am) == CUPTI_SUCCESS) {
      s.metrics.push_back(name);
      s.defs.push_back(def);
    } else {
      s.unavailable.emplace_back(name);
    }
  }
  if (s.metrics.empty()) {
    // Nothing to configure: profile() will report zeros for these metrics (listed as unavailable).
    return;
  }

  auto cs = make_params<CUpti_Profiler_Host_GetConfigImageSize_Params>(CUpti_Profiler_Host_GetConfigImageSize_Params_STRUCT_SIZE);
  cs.pHostObject = s.host;
  CUPTI_CHECK(api().cuptiProfilerHostGetConfigImageSize(&cs));
  s.config.resize(cs.configImageSize);
  auto ci = make_params<CUpti_Profiler_Host_GetConfigImage_Params>(CUpti_Profiler_Host_GetConfigImage_Params_STRUCT_SIZE);
  ci.pHostObject = s.host;
  ci.configImageSize = s.config.size();
  ci.pConfigImage = s.config.data();
  CUPTI_CHECK(api().cuptiProfilerHostGetConfigImage(&ci));

  auto np = make_params<CUpti_Profiler_Host_GetNumOfPasses_Params>(CUpti_Profiler_Host_GetNumOfPasses_Params_STRUCT_SIZE);
  np.configImageSize = s.config.size();
  np.pConfigImage = s.config.data();
  CUPTI_CHECK(api().cuptiProfilerHostGetNumOfPasses(&np));
  s.passes = np.numOfPasses;
}

RangeProfiler::~RangeProfiler() {
  if (impl_ && impl_->host) {
    auto dp = make_params<CUpti_Profiler_Host_Deinitialize_Params>(CUpti_Profiler_Host_Deinitialize_Params_STRUCT_SIZE);
    dp.pHostObject = impl_->host;
    api().cuptiProfilerHostDeinitialize(&dp);  // destructor: nothing useful to do with an error
  }
}

std::size_t RangeProfiler::passes() const { return impl_->passes; }
const std::vector<std::string>& RangeProfiler::unavailable_metrics() const { return impl_->unavailable; }

std::vector<KernelCounters> RangeProfiler::profile(const std::function<void()>& launches, std::size_t max_ranges) {
  Impl& s = *impl_;
  const std::size_t nm = s.metrics.size();
  if (nm == 0) throw CudaError("RangeProfiler: no metric of this configuration is available on " + s.chip);

  auto en = make_params<CUpti_RangeProfiler_Enable_Params>(CUpti_RangeProfiler_Enable_Params_STRUCT_SIZE);
  en.ctx = s.ctx;
  CUPTI_CHECK(api().cuptiRangeProfilerEnable(&en));
  CUpti_RangeProfiler_Object* obj = en.pRangeProfilerObject;
  // Disable on every exit path, also when a launch throws.
  struct Disabler {
    CUpti_RangeProfiler_Object* o;
    ~Disabler() {
      auto dp = make_params<CUpti_RangeProfiler_Disable_Params>(CUpti_RangeProfiler_Disable_Params_STRUCT_SIZE);
      dp.pRangeProfilerObject = o;
      api().cuptiRangeProfilerDisable(&dp);
    }
  } disabler{obj};

  auto gs = make_params<CUpti_RangeProfiler_GetCounterDataSize_Params>(CUpti_RangeProfiler_GetCounterDataSize_Params_STRUCT_SIZE);
  gs.pRangeProfilerObject = obj;
  gs.pMetricNames = s.metrics.data();
  gs.numMetrics = nm;
  gs.maxNumOfRanges = max_ranges;
  gs.maxNumRangeTreeNodes = max_ranges;
  CUPTI_CHECK(api().cuptiRangeProfilerGetCounterDataSize(&gs));
  std::vector<std::uint8_t> data(gs.counterDataSize);
  auto di = make_params<CUpti_RangeProfiler_CounterDataImage_Initialize_Params>(CUpti_RangeProfiler_CounterDataImage_Initialize_Params_STRUCT_SIZE);
  di.pRangeProfilerObject = obj;
  di.counterDataSize = data.size();
  di.pCounterData = data.data();
  CUPTI_CHECK(api().cuptiRangeProfilerCounterDataImageInitialize(&di));

  auto sc = make_params<CUpti_RangeProfiler_SetConfig_Params>(CUpti_RangeProfiler_SetConfig_Params_STRUCT_SIZE);
  sc.pRangeProfilerObject = obj;
  sc.configSize = s.config.size();
  sc.pConfig = s.config.data();
  sc.counterDataImageSize = data.size();
  sc.pCounterDataImage = data.data();
  sc.range = CUPTI_AutoRange;
  sc.replayMode = CUPTI_KernelReplay;
  sc.maxRangesPerPass = max_ranges;
  sc.numNestingLevels = 1;
  sc.minNestingLevel = 1;
  sc.passIndex = 0;
  sc.targetNestingLevel = 0;
  CUPTI_CHECK(api().cuptiRangeProfilerSetConfig(&sc));

  auto st = make_params<CUpti_RangeProfiler_Start_Params>(CUpti_RangeProfiler_Start_Params_STRUCT_SIZE);
  st.pRangeProfilerObject = obj;
  CUPTI_CHECK(api().cuptiRangeProfilerStart(&st));
  launches();
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  FLASHLAB_CUDA_CHECK(cudaGetLastError());
  auto sp = make_params<CUpti_RangeProfiler_Stop_Params>(CUpti_RangeProfiler_Stop_Params_STRUCT_SIZE);
  sp.pRangeProfilerObject = obj;
  CUPTI_CHECK(api().cuptiRangeProfilerStop(&sp));
  auto dd = make_params<CUpti_RangeProfiler_DecodeData_Params>(CUpti_RangeProfiler_DecodeData_Params_STRUCT_SIZE);
  dd.pRangeProfilerObject = obj;
  CUPTI_CHECK(api().cuptiRangeProfilerDecodeData(&dd));
  if (dd.numOfRangeDropped != 0)
    throw CudaError("CUPTI dropped " + std::to_string(dd.numOfRangeDropped) +
                    " ranges (hint: launch fewer kernels per session than max_ranges = " + std::to_string(max_ranges) +
                    ")");

  auto gi = make_params<CUpti_RangeProfiler_GetCounterDataInfo_Params>(CUpti_RangeProfiler_GetCounterDataInfo_Params_STRUCT_SIZE);
  gi.pCounterDataImage = data.data();
  gi.counterDataImageSize = data.size();
  CUPTI_CHECK(api().cuptiRangeProfilerGetCounterDataInfo(&gi));

  std::vector<KernelCounters> out;
  std::vector<double> values(nm);
  for (std::size_t r = 0; r < gi.numTotalRanges; ++r) {
    auto ri = make_params<CUpti_RangeProfiler_CounterData_GetRangeInfo_Params>(CUpti_RangeProfiler_CounterData_GetRangeInfo_Params_STRUCT_SIZE);
    ri.pCounterDataImage = data.data();
    ri.counterDataImageSize = data.size();
    ri.rangeIndex = r;
    ri.rangeDelimiter = "/";
    CUPTI_CHECK(api().cuptiRangeProfilerCounterDataGetRangeInfo(&ri));
    auto ev = make_params<CUpti_Profiler_Host_EvaluateToGpuValues_Params>(CUpti_Profiler_Host_EvaluateToGpuValues_Params_STRUCT_SIZE);
    ev.pHostObject = s.host;
    ev.pCounterDataImage = data.data();
    ev.counterDataImageSize = data.size();
    ev.rangeIndex = r;
    ev.ppMetricNames = s.metrics.data();
    ev.numMetrics = nm;
    ev.pMetricValues = values.data();
    CUPTI_CHECK(api().cuptiProfilerHostEvaluateToGpuValues(&ev));
    KernelCounters k;
    k.range_name = ri.rangeName ? ri.rangeName : "";
    for (std::size_t m = 0; m < nm; ++m) k.*(s.defs[m]->field) += values[m] * s.defs[m]->factor;
    out.push_back(std::move(k));
  }
  return out;
}

}  // namespace flashlab::cuda
