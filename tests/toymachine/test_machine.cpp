// The ISA table, the built-in profiles (the lesson's list) and the machine-file parser.
#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>

#include "flashlab/toymachine/isa.hpp"
#include "flashlab/toymachine/machine.hpp"

using namespace flashlab::toy;

TEST_CASE("ISA table: one row per opcode, in order, with the lesson's operand patterns", "[isa]") {
  REQUIRE(isa().size() == static_cast<std::size_t>(kOpcodeCount));
  for (std::size_t i = 0; i < isa().size(); ++i) {
    CHECK(static_cast<std::size_t>(isa()[i].opcode) == i);
    CHECK(isa()[i].pattern.size() == static_cast<std::size_t>(std::count(isa()[i].operands.begin(), isa()[i].operands.end(), ',') + 1));
    CHECK(isa()[i].default_cycles == 1);
  }
  CHECK(isa_entry(Opcode::MAC).operands == "Ra, Rb, Rc, Rd");
  CHECK(isa_entry(Opcode::MAC).semantics == "Rd = Ra × Rb + Rc");
  CHECK(isa_entry(Opcode::LOAD).operands == "src, Rd");
  CHECK(isa_entry(Opcode::DIV).semantics == "Rd = Ra / Rb");
  REQUIRE(find_instruction("mac_z") != nullptr);
  CHECK(find_instruction("mac_z")->opcode == Opcode::MAC_Z);
  CHECK(find_instruction("Store")->opcode == Opcode::STORE);
  CHECK(find_instruction("MACZ") == nullptr);
  CHECK(find_instruction("") == nullptr);
}

TEST_CASE("built-in profiles match the lesson's machines", "[machine]") {
  CHECK(builtin_machine_names() == std::vector<std::string>{"matmul3", "matmul6", "softmax3", "softmax4"});
  const Machine m3 = builtin_machine("matmul3");
  CHECK(m3.registers == std::vector<std::string>{"R0", "R1", "R2"});
  CHECK(m3.isa_list() == "LOAD STORE MAC_Z MAC");
  CHECK(m3.array_list() == "a[2][2] (input), b[2][2] (input), c[2][2] (output)");
  CHECK(m3.register_list() == "R0..R2");
  CHECK(builtin_machine("matmul6").register_list() == "R0..R5");
  const Machine s3 = builtin_machine("softmax3", 5);
  CHECK(s3.registers == std::vector<std::string>{"R0", "r1", "r2"});
  CHECK(s3.isa_list() == "LOAD STORE MAX SUB EXP ADD MUL DIV MOV");
  CHECK(s3.array_list() == "x[5] (input), out[5] (output)");
  CHECK(s3.n == 5);
  CHECK(builtin_machine("softmax4").registers.back() == "r3");
  CHECK(builtin_machine("softmax4").array_list() == "x[8] (input), out[8] (output)");
  CHECK(s3.find_register("R1") == 1);
  CHECK(s3.find_register("r0") == 0);
  CHECK(s3.find_register("r3") == -1);
  for (const auto& name : builtin_machine_names())
    for (auto op : builtin_machine(name).opcodes) CHECK(builtin_machine(name).cycles[static_cast<std::size_t>(op)] == 1);
}

TEST_CASE("built-in profiles: errors", "[machine][errors]") {
  CHECK_THROWS_WITH(builtin_machine("matmul4"), "unknown machine 'matmul4'");
  try {
    builtin_machine("nope");
  } catch (const MachineError& e) {
    CHECK(e.hint() == "the built-in machines are matmul3, matmul6, softmax3, softmax4 (flashlab machines lists them)");
  }
  CHECK_THROWS_WITH(builtin_machine("softmax3", 0), "n = 0 is out of range");
}

TEST_CASE("machine file: the documented example parses", "[machine][file]") {
  const char* text =
      "# softmax with a slow exponential\n"
      "machine slowexp\n"
      "description \"softmax3 with EXP costing 4 cycles\"\n"
      "registers R0, r1, r2\n"
      "isa LOAD STORE MAX SUB EXP ADD MUL DIV MOV\n"
      "cycles EXP 4\n"
      "input x[n]\n"
      "output out[n]\n"
      "input w[2][n+1]\n"
      "constant one = 1\n"
      "constant half[2] = 0.5, 0.5\n";
  const Machine m = parse_machine_file(text, "slow.machine", 3);
  CHECK(m.name == "slowexp");
  CHECK(m.description == "softmax3 with EXP costing 4 cycles");
  CHECK(m.registers == std::vector<std::string>{"R0", "r1", "r2"});
  CHECK(m.cycles[static_cast<std::size_t>(Opcode::EXP)] == 4);
  CHECK(m.cycles[static_cast<std::size_t>(Opcode::ADD)] == 1);
  CHECK(m.array_list() == "x[3] (input), out[3] (output), w[2][4] (input), one (constant), half[2] (constant)");
  CHECK(m.arrays[3].values == std::vector<double>{1.0});
  CHECK(m.arrays[4].values == std::vector<double>{0.5, 0.5});
  CHECK(m.arrays[2].element_name(5) == "w11");
  CHECK(m.arrays[2].element_operand(5) == "w[1][1]");
  CHECK(m.n == 3);
}

namespace {
std::string file_error(const std::string& text, int n = 4) {
  try {
    parse_machine_file(text, "m.machine", n);
  } catch (const MachineError& e) {
    REQUIRE(e.diagnostic().has_value());
    return format_diagnostic(*e.diagnostic());
  }
  FAIL("the machine file parsed");
  return "";
}
}  // namespace

TEST_CASE("machine file: errors are located, with a hint", "[machine][file][errors]") {
  CHECK(file_error("registers R0 r1\nisa LOAD FMA\n") ==
        "m.machine:2:10: error: unknown instruction 'FMA'\n"
        "  isa LOAD FMA\n"
        "           ^^^\n"
        "hint: the instructions are LOAD STORE MAC_Z MAC MAX SUB EXP ADD MUL DIV MOV\n");
  CHECK(file_error("registers R0 r0\n") ==
        "m.machine:1:14: error: register r0 is declared twice\n"
        "  registers R0 r0\n"
        "               ^^\n"
        "hint: register names are case-insensitive: R1 and r1 are the same\n");
  CHECK(file_error("registers R0\nisa LOAD\ninput x[n-4]\n") ==
        "m.machine:3:9: error: dimension 0 is out of range\n"
        "  input x[n-4]\n"
        "          ^^^\n"
        "hint: each dimension must be 1..1048576 (with n = 4)\n");
  CHECK(file_error("registers R0\nisa LOAD\nconstant w[2] = 1, x\n") ==
        "m.machine:3:20: error: 'x' is not a number\n"
        "  constant w[2] = 1, x\n"
        "                     ^\n"
        "hint: constant values are decimal numbers, e.g. 1, -0.5, 2e-3\n");
  CHECK(file_error("registers R0\nisa LOAD\nconstant w[3] = 1, 2\n") ==
        "m.machine:3:17: error: w[3] needs 3 values, got 2\n"
        "  constant w[3] = 1, 2\n"
        "                  ^^^^\n"
        "hint: list the values row-major, separated by commas\n");
  CHECK(file_error("registers R0\nisa LOAD\ninput x[k]\n") ==
        "m.machine:3:9: error: unknown name 'k'\n"
        "  input x[k]\n"
        "          ^\n"
        "hint: sizes are integer expressions in n, e.g. n, 2, n+1, 2*n\n");
  CHECK(file_error("registers R0\nisa LOAD\nwires 3\n") ==
        "m.machine:3:1: error: unknown directive 'wires'\n"
        "  wires 3\n"
        "  ^^^^^\n"
        "hint: machine files use: machine, description, registers, isa, cycles, input, output, constant\n");
  CHECK(file_error("isa LOAD\ninput x[n]\n") ==
        "m.machine:2:1: error: the machine declares no registers\n"
        "  input x[n]\n"
        "  ^\n"
        "hint: add a line such as: registers R0 r1 r2\n");
  CHECK(file_error("registers R0\nisa LOAD\ncycles LOAD 0\n") ==
        "m.machine:3:13: error: '0' is not a cycle count\n"
        "  cycles LOAD 0\n"
        "              ^\n"
        "hint: a whole number from 1 to 1000000\n");
}

TEST_CASE("docs/toymachine.md lists every ISA row as the table has it", "[isa][docs]") {
  std::ifstream in(std::string(FLASHLAB_SOURCE_DIR) + "/docs/toymachine.md");
  REQUIRE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string doc = ss.str();
  for (const auto& e : isa()) {
    const std::string row = "| `" + e.mnemonic + " " + e.operands + "` | " + e.semantics + " | " + e.doc + " |";
    INFO(row);
    CHECK(doc.find(row) != std::string::npos);
  }
}
