/// @file tile.hpp
/// @brief The tile model of the toy-machine lesson "Element is Tile" and "Inner Product vs. Outer Product in
/// Attention": a register holds a whole tile and LOAD/STORE move a tile between HBM and fast
/// memory. HBM holds Q, K, V as n tiles each (Br rows × d) and O as n running-state tiles
/// (m, ℓ, numerator per row; the lesson text's "Full update rules"), initially empty. One compute instruction,
/// `ATTN Rq, Rk, Rv, Ro`, merges the block (Q_i, K_j, V_j) into the running state held in Ro —
/// the lesson text's tile merge. The values are real numbers, so a finished O is checked against
/// softmax(QKᵀ)V; the counters are the lesson text's cost table (Q/K/V/O loads and stores, in tiles).
///
/// Trace syntax (the toy machine's front end: step numbers, comments, loops and their limits):
/// @code
/// for i in 0..n-1
///   LOAD Q[i], R0
///   LOAD O[i], R3
///   for j in 0..n-1
///     LOAD K[j], R1
///     LOAD V[j], R2
///     ATTN R0, R1, R2, R3
///   end
///   STORE R3, O[i]
/// end
/// @endcode
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "flashlab/toymachine/diagnostic.hpp"
#include "flashlab/toymachine/frontend.hpp"

namespace flashlab::lessons::tile {

/// The tile instructions.
enum class TileOp {
  LOAD,   ///< `LOAD T[idx], Rd`: fast-memory slot Rd = HBM tile T[idx] (T is Q, K, V or O)
  STORE,  ///< `STORE Rs, O[idx]`: HBM O[idx] = the running state in Rs (only O is written)
  ATTN    ///< `ATTN Rq, Rk, Rv, Ro`: merge the block softmax(Q Kᵀ)·V into the state in Ro
};

/// One expanded tile instruction.
struct TileInstruction {
  TileOp op = TileOp::LOAD;  ///< the opcode
  char tensor = 'Q';         ///< LOAD/STORE: 'Q', 'K', 'V' or 'O'
  long long index = 0;       ///< LOAD/STORE: the tile index
  std::array<int, 4> regs{{-1, -1, -1, -1}};  ///< register operands (LOAD: regs[0] = Rd; STORE: regs[0] = Rs)
  int source_line = 0;       ///< 1-based line in the trace
  std::string text;          ///< as written, loop indices substituted
};

/// The sizes of one tile problem.
struct TileShape {
  int n = 4;      ///< tiles per tensor (query tiles = KV tiles = n)
  int rows = 2;   ///< rows per tile (Br = Bc)
  int d = 3;      ///< head dimension
  int slots = 4;  ///< fast-memory tile slots (registers R0..R(slots−1))
};

/// An assembled tile trace (diagnostics use the toy machine's Diagnostic and format_diagnostic).
struct TileProgram {
  std::vector<TileInstruction> code;              ///< expanded instructions
  std::vector<toy::Diagnostic> diagnostics;       ///< errors; the program is valid only when empty
  /// True when the trace assembled without errors.
  [[nodiscard]] bool ok() const { return diagnostics.empty(); }
};

/// Assembles a tile trace for `shape` (indices may use `n` and loop variables).
TileProgram assemble_tiles(std::string_view text, const TileShape& shape, std::string_view filename);

/// Transfers per tensor, in tiles.
struct TileCounters {
  std::map<char, std::uint64_t> loads;   ///< tensor → tiles loaded ('Q', 'K', 'V', 'O')
  std::map<char, std::uint64_t> stores;  ///< tensor → tiles stored ('O')
  std::uint64_t attn = 0;                ///< ATTN instructions (block updates)
  std::uint64_t steps = 0;               ///< instructions executed
};

/// The result of running a tile trace.
struct TileRun {
  TileCounters counters;               ///< the transfers
  std::optional<std::string> fault;    ///< "step 7 (line 9): …" when an instruction could not run
  std::string fault_hint;              ///< what to do about the fault
  /// Per query tile i: the KV tiles j merged into the O[i] that ended in HBM (sorted).
  std::vector<std::vector<long long>> merged;
  /// The final output, row-major (n·rows) × d: numerator / ℓ of each stored state; NaN for
  /// rows of a tile never stored.
  std::vector<double> out;
};

/// Runs `program` on Q, K, V (each row-major (n·rows) × d).
/// @throws std::invalid_argument when an input has the wrong size.
TileRun run_tiles(const TileProgram& program, const TileShape& shape, const std::vector<double>& q,
                  const std::vector<double>& k, const std::vector<double>& v);

/// The shape the tile lessons use at size n: tiles of 2 rows, d = 3, four slots.
TileShape lesson_shape(int n);

/// Seeded random Q, K, V for a tile problem, each row-major (n·rows) × d, uniform in [−2, 2].
struct TileInputs {
  std::vector<double> q;  ///< queries
  std::vector<double> k;  ///< keys
  std::vector<double> v;  ///< values
};

/// Same seed → same inputs.
TileInputs random_tile_inputs(const TileShape& shape, std::uint64_t seed);

/// softmax(Q Kᵀ) V row by row in float64, the independent reference for the tile lessons.
std::vector<double> naive_attention(const std::vector<double>& q, const std::vector<double>& k,
                                    const std::vector<double>& v, int rows, int d);

}  // namespace flashlab::lessons::tile
