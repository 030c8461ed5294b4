// The --json / --csv writer (report.hpp).
#include "core/report.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <ostream>
#include <stdexcept>

namespace flashlab::app {

namespace {

void replay(Json& j, const Value& v) {
  switch (v.kind) {
    case Value::Kind::null: j.null(); break;
    case Value::Kind::boolean: j.value(v.boolean); break;
    case Value::Kind::integer: j.value(v.integer); break;
    case Value::Kind::unsigned_integer: j.value(v.unsigned_integer); break;
    case Value::Kind::number: j.value(v.number); break;
    case Value::Kind::string: j.value(v.string); break;
    case Value::Kind::array:
      j.begin_array();
      for (const auto& item : v.items) replay(j, item);
      j.end_array();
      break;
    case Value::Kind::object:
      j.begin_object();
      for (const auto& [k, item] : v.members) {
        j.key(k);
        replay(j, item);
      }
      j.end_object();
      break;
  }
}

std::string number_text(double d) {
  if (!std::isfinite(d)) return "";
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof buf, d);
  return std::string(buf, static_cast<std::size_t>(res.ptr - buf));
}

bool is_table(const Value& v) {
  return v.kind == Value::Kind::array && !v.items.empty() &&
         std::all_of(v.items.begin(), v.items.end(), [](const Value& i) { return i.kind == Value::Kind::object; });
}

std::string scalar_text(const Value& v) {
  switch (v.kind) {
    case Value::Kind::null: return "";
    case Value::Kind::boolean: return v.boolean ? "true" : "false";
    case Value::Kind::integer: return std::to_string(v.integer);
    case Value::Kind::unsigned_integer: return std::to_string(v.unsigned_integer);
    case Value::Kind::number: return number_text(v.number);
    case Value::Kind::string: return v.string;
    default: return "";
  }
}

// A list of scalars as one cell, "1 2 3"; a list of lists "1 2;3 4".
std::string list_text(const Value& v) {
  std::string cell;
  const bool nested = !v.items.empty() && v.items.front().kind == Value::Kind::array;
  for (const auto& item : v.items) {
    if (&item != &v.items.front()) cell += nested ? ';' : ' ';
    cell += item.kind == Value::Kind::array ? list_text(item) : scalar_text(item);
  }
  return cell;
}

using Fields = std::vector<std::pair<std::string, std::string>>;

// One row's fields: nested objects dotted, lists of scalars one space-separated cell, lists of
// objects indexed.
void flatten(const std::string& prefix, const Value& v, Fields& out) {
  if (v.kind == Value::Kind::object) {
    for (const auto& [k, item] : v.members) flatten(prefix.empty() ? k : prefix + "." + k, item, out);
  } else if (v.kind == Value::Kind::array) {
    if (is_table(v)) {
      for (std::size_t i = 0; i < v.items.size(); ++i) flatten(prefix + "." + std::to_string(i), v.items[i], out);
    } else {
      out.emplace_back(prefix, list_text(v));
    }
  } else {
    out.emplace_back(prefix, scalar_text(v));
  }
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

}  // namespace

void write_json(std::ostream& os, const Value& v) {
  Json j(os);
  replay(j, v);
  j.finish();
}

std::vector<std::vector<std::string>> csv_rows(const Value& v) {
  std::vector<Fields> rows;
  if (is_table(v)) {
    for (const auto& item : v.items) {
      rows.emplace_back();
      flatten("", item, rows.back());
    }
  } else if (v.kind == Value::Kind::object) {
    const auto table = std::find_if(v.members.begin(), v.members.end(), [](const auto& m) { return is_table(m.second); });
    Fields common;
    for (auto m = v.members.begin(); m != v.members.end(); ++m)
      if (m != table) flatten(m->first, m->second, common);
    if (table == v.members.end()) {
      rows.push_back(common);
    } else {
      for (const auto& item : table->second.items) {
        rows.push_back(common);
        flatten(table->first, item, rows.back());
      }
    }
  } else {
    rows.emplace_back();
    flatten("value", v, rows.back());
  }
  // The header: every column in the order first seen; a row without one leaves it empty.
  std::vector<std::string> header;
  for (const auto& r : rows)
    for (const auto& [k, cell] : r)
      if (std::find(header.begin(), header.end(), k) == header.end()) header.push_back(k);
  std::vector<std::vector<std::string>> out{header};
  for (const auto& r : rows) {
    std::vector<std::string> line(header.size());
    for (const auto& [k, cell] : r)
      line[std::size_t(std::find(header.begin(), header.end(), k) - header.begin())] = cell;
    out.push_back(std::move(line));
  }
  return out;
}

void write_csv(std::ostream& os, const Value& v) {
  for (const auto& row : csv_rows(v)) {
    for (std::size_t i = 0; i < row.size(); ++i) os << (i ? "," : "") << csv_field(row[i]);
    os << "\n";
  }
}

ReportOutput::ReportOutput(OutputFormat format, std::ostream& os) : format_(format), os_(os), json_(doc_) {}

void ReportOutput::finish() {
  if (format_ == OutputFormat::csv) write_csv(os_, doc_);
  else write_json(os_, doc_);
}

RowStream::RowStream(OutputFormat format, std::ostream& os) : format_(format), os_(os), json_(os) {
  if (format_ == OutputFormat::json) json_.begin_array();
}

void RowStream::row(const Value& row) {
  if (format_ == OutputFormat::json) {
    replay(json_, row);
  } else {
    const auto rows = csv_rows(row);  // an object without a table: the header and one row
    if (!header_) {
      header_ = rows.front();
      for (std::size_t i = 0; i < header_->size(); ++i) os_ << (i ? "," : "") << csv_field((*header_)[i]);
      os_ << "\n";
    } else if (rows.front() != *header_) {
      throw std::logic_error("RowStream: a row's columns differ from the table's header");
    }
    for (std::size_t i = 0; i < rows[1].size(); ++i) os_ << (i ? "," : "") << csv_field(rows[1][i]);
    os_ << "\n";
  }
  os_.flush();
}

void RowStream::finish() {
  if (format_ != OutputFormat::json) return;
  json_.end_array();
  json_.finish();
  os_.flush();
}

double round_to(double x, int decimals) {
  if (!std::isfinite(x)) return x;
  const double scale = std::pow(10.0, decimals);
  return std::round(x * scale) / scale;
}

}  // namespace flashlab::app
