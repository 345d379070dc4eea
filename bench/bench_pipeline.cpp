// Pipeline bubble benchmark, one rank of `atoll launch --nproc-per-node P` (P = pipeline stages):
// a GPT cut into P stages trains STEPS steps of M micro-batches under one schedule; every rank
// records when each of its actions (forward / backward / weight pass of micro-batch i on chunk c)
// started and ended. For the median step (by makespan) rank 0 gathers the timelines and prints
// one JSON line: the measured bubble, 1 - (sum of the ranks' busy time) / (P x makespan), next to
// the schedule's ideal, (p-1)/(m+p-1) for gpipe and 1f1b, (p-1)/(v·m+p-1) interleaved, and the
// unit-cost simulation's for zb-h1 (pipeline_schedule.h), and the simulation's with this run's own
// mean F/B/W costs (imbalance between stages aside); the idle time per rank in ms; and the
// path of an SVG timeline of that step (written by hand: one row per rank, one box per action).
// There is no peer here: PyTorch 1.13 on CPU has no pipeline schedules, so the ideal is the
// formula. Timings come from steady_clock, the same clock in every process of one machine.
//
// usage: bench_pipeline SCHEDULE V M N_LAYER N_EMBD B T STEPS [THREADS] [SVG]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/threads.h"
#include "kernels/cpu/isa.h"
#include "models/gpt/gpt.h"
#include "optim/clip.h"
#include "parallel/mesh.h"
#include "parallel/pipeline.h"
#include "tensor/rng.h"

using namespace atl;
using parallel::PipeOp;

namespace {

struct Span {
  int rank, op, mb, chunk;
  double t0, t1;  // seconds from the step's first action
};

void write_svg(const std::string& path, const std::vector<Span>& spans, int p, double T, const std::string& title) {
  const double W = 960, row = 34, left = 70, top = 40;
  const double sx = (W - left - 20) / std::max(T, 1e-9);
  std::ofstream f(path);
  f << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << top + row * p + 40
    << "\" font-family=\"monospace\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << left << "\" y=\"20\" font-size=\"13\">" << title << "</text>\n";
  const char* colour[] = {"#4e79a7", "#59a14f", "#b07aa1"};  // F, B, W
  for (int r = 0; r < p; ++r)
    f << "<text x=\"8\" y=\"" << top + row * r + row / 2 + 4 << "\">rank " << r << "</text>\n";
  for (const Span& s : spans) {
    double x = left + s.t0 * sx, w = std::max(0.5, (s.t1 - s.t0) * sx), y = top + row * s.rank + 3;
    // Later chunks of interleaved schedules are drawn lighter.
    f << "<rect x=\"" << x << "\" y=\"" << y << "\" width=\"" << w << "\" height=\"" << row - 6 << "\" fill=\""
      << colour[s.op] << "\" fill-opacity=\"" << (s.chunk == 0 ? 1.0 : 0.6) << "\" stroke=\"white\" stroke-width=\"0.5\"/>\n";
    if (w > 14)
      f << "<text x=\"" << x + w / 2 << "\" y=\"" << y + row / 2 << "\" fill=\"white\" text-anchor=\"middle\">"
        << parallel::pipe_op_name(PipeOp(s.op)) << s.mb << "</text>\n";
  }
  double ty = top + row * p + 18;
  f << "<line x1=\"" << left << "\" y1=\"" << ty - 12 << "\" x2=\"" << left + T * sx << "\" y2=\"" << ty - 12
    << "\" stroke=\"black\"/>\n<text x=\"" << left << "\" y=\"" << ty + 4 << "\">0</text>\n<text x=\"" << left + T * sx
    << "\" y=\"" << ty + 4 << "\" text-anchor=\"end\">" << fmt::format("{:.1f} ms", T * 1e3) << "</text>\n"
    << "<text x=\"" << left + 200 << "\" y=\"" << ty + 4
    << "\"><tspan fill=\"#4e79a7\">F forward</tspan>  <tspan fill=\"#59a14f\">B backward</tspan>  <tspan "
       "fill=\"#b07aa1\">W weight gradients</tspan></text>\n</svg>\n";
  ATOLL_CHECK(f.good(), "cannot write {}", path);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 9) {
    std::fprintf(stderr, "usage: bench_pipeline SCHEDULE V M N_LAYER N_EMBD B T STEPS [THREADS] [SVG]\n");
    return 2;
  }
  try {
    std::string schedule = argv[1];
    int v = std::atoi(argv[2]), m = std::atoi(argv[3]), L = std::atoi(argv[4]), C = std::atoi(argv[5]);
    int64_t B = std::atoll(argv[6]), T = std::atoll(argv[7]);
    int steps = std::atoi(argv[8]);
    int threads = argc > 9 ? std::atoi(argv[9]) : 1;
    std::string svg = argc > 10 ? argv[10] : "/tmp/atoll_pipeline_" + schedule + ".svg";
    set_num_threads(threads);
    auto comm = comm::make_communicator("gloo");
    const int p = comm->size(), rank = comm->rank();
    ATOLL_CHECK(p >= 2, "bench_pipeline runs as 2 or more ranks of `atoll launch`");

    nn::GPTConfig c = nn::GPTConfig::preset("gpt2");
    c.n_layer = L;
    c.n_embd = C;
    c.n_head = c.n_kv_head = std::max(1, C / 64);
    c.vocab_size = 257;
    c.block_size = T;
    nn::GPT model(c);
    model.init_weights(1);
    parallel::MeshShape ms;
    ms.pp = p;
    parallel::Mesh mesh(comm.get(), ms);
    parallel::PipelineConfig pc;
    pc.pp = p;
    pc.schedule = schedule;
    pc.virtual_stages = v;
    parallel::PipelineParallel pipe(model, comm.get(), mesh, pc, m, "ddp", AdamWConfig{});
    Rng rng(100, 0);
    std::vector<Tensor> xs, ys;
    for (int i = 0; i < m; ++i) {
      xs.push_back(Tensor::empty({B, T}, DType::i32));
      ys.push_back(Tensor::empty({B, T}, DType::i32));
      for (int64_t k = 0; k < B * T; ++k) {
        xs.back().i32()[k] = int32_t(rng.next_u32() % 257);
        ys.back().i32()[k] = int32_t(rng.next_u32() % 257);
      }
    }
    // Per step, every rank's spans: (op, mb, chunk, t0 hi, t0 lo, t1 hi, t1 lo) as f32 (a
    // steady-clock double split in two), padded to the longest action list.
    size_t most = 0;
    for (auto& l : pipe.schedule().ranks) most = std::max(most, l.size());
    const int64_t per = int64_t(most) * 7;
    std::vector<std::vector<Span>> all_steps;
    std::vector<double> makespans;
    for (int s = 0; s < steps; ++s) {
      comm->barrier();
      pipe.zero_grad();
      pipe.forward_backward(xs, ys);
      pipe.finish_backward();
      pipe.step({1.f, clip_coefficient(pipe.grad_norm(), 1.f)});
      Tensor mine = Tensor::zeros({per}), every = Tensor::empty({per * p});
      const auto& tl = pipe.timeline();
      for (size_t i = 0; i < tl.size(); ++i) {
        float* e = mine.f32() + i * 7;
        e[0] = float(int(tl[i].op));
        e[1] = float(tl[i].mb);
        e[2] = float(tl[i].chunk);
        e[3] = float(tl[i].t0);
        e[4] = float(tl[i].t0 - double(e[3]));
        e[5] = float(tl[i].t1);
        e[6] = float(tl[i].t1 - double(e[5]));
      }
      comm->all_gather(mine, every);
      std::vector<Span> spans;
      double t_min = 1e300, t_max = -1e300;
      for (int r = 0; r < p; ++r)
        for (size_t i = 0; i < pipe.schedule().ranks[size_t(r)].size(); ++i) {
          const float* e = every.f32() + r * per + int64_t(i) * 7;
          Span sp{r, int(e[0]), int(e[1]), int(e[2]), double(e[3]) + double(e[4]), double(e[5]) + double(e[6])};
          t_min = std::min(t_min, sp.t0);
          t_max = std::max(t_max, sp.t1);
          spans.push_back(sp);
        }
      for (Span& sp : spans) {
        sp.t0 -= t_min;
        sp.t1 -= t_min;
      }
      all_steps.push_back(spans);
      makespans.push_back(t_max - t_min);
    }
    if (rank == 0) {
      // The median step after the first (warm-up).
      std::vector<size_t> idx;
      for (size_t i = steps > 1 ? 1 : 0; i < makespans.size(); ++i) idx.push_back(i);
      std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return makespans[a] < makespans[b]; });
      size_t med = idx[idx.size() / 2];
      const auto& spans = all_steps[med];
      double Tm = makespans[med];
      std::vector<double> busy(size_t(p), 0), by_op(3, 0);
      for (const Span& sp : spans) {
        busy[size_t(sp.rank)] += sp.t1 - sp.t0;
        by_op[size_t(sp.op)] += sp.t1 - sp.t0;
      }
      double total_busy = 0;
      for (double b : busy) total_busy += b;
      double bubble = 1.0 - total_busy / (double(p) * Tm);
      double ideal = schedule == "interleaved" ? (p - 1.0) / (double(v) * m + p - 1.0)
                     : schedule == "zb-h1"      ? parallel::simulate(pipe.schedule()).bubble
                                                : (p - 1.0) / (double(m) + p - 1.0);
      double n_act = double(m) * p;
      // The schedule's bubble with this run's mean action costs (a chunk's share of them), free sends.
      double sim = parallel::simulate(pipe.schedule(), by_op[0] / n_act / v, by_op[1] / n_act / v,
                                      pipe.schedule().split_backward ? by_op[2] / n_act / v : 0.0)
                       .bubble;
      write_svg(svg, spans, p, Tm,
                fmt::format("{} pp={} m={}{}: bubble {:.1f}% (ideal {:.1f}%), step {:.1f} ms", schedule, p, m,
                            v > 1 ? fmt::format(" v={}", v) : "", bubble * 100, ideal * 100, Tm * 1e3));
      nlohmann::json out = {{"bench", "pipeline_bubble"},
                            {"cpu", cpu::cpu_features().model},
                            {"schedule", schedule},
                            {"p", p},
                            {"m", m},
                            {"v", v},
                            {"model", model.describe()},
                            {"B", B},
                            {"T", T},
                            {"threads", threads},
                            {"step_ms", Tm * 1e3},
                            {"bubble", bubble},
                            {"ideal", ideal},
                            {"sim_measured_costs", sim},
                            {"idle_ms_per_rank", (double(p) * Tm - total_busy) / p * 1e3},
                            {"F_ms", by_op[0] / n_act * 1e3},
                            {"B_ms", by_op[1] / n_act * 1e3},
                            {"W_ms", by_op[2] / n_act * 1e3},
                            {"svg", svg}};
      std::printf("%s\n", out.dump().c_str());
    }
    comm->barrier();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_pipeline: %s\n", e.what());
    return 1;
  }
}
