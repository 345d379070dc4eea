// DiLoCo (Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language Models",
// 2023): each island trains H inner steps on its own (any registered inner optimizer, DDP or
// ZeRO-1/2 inside the island), then the pseudo-gradient theta_start - theta_end is averaged over
// the islands and applied to the global parameters by an outer Nesterov SGD (lr 0.7, momentum
// 0.9 by default); every island then continues from the new global parameters, so after each
// outer step all islands hold bitwise the same parameters. With H = 1, outer lr 1 and no outer
// momentum, and a linear inner optimizer ([optim] type = "sgd"), it is DDP.
#pragma once
#include "lowcomm/lowcomm.h"

namespace atl::lowcomm {

class DiLoCo : public LowComm {
 public:
  DiLoCo(const LowCommConfig& c, parallel::Mesh& mesh, comm::Communicator* world, Config& cfg)
      : LowComm(c, mesh, world, cfg) {}
  std::string describe() const override;

 protected:
  nlohmann::json sync(int64_t step) override;
  void save_method(std::vector<std::pair<std::string, Tensor>>&, nlohmann::json&) override {}
  void load_method(const TensorFile&, const nlohmann::json&, const std::string&) override {}
  // The averaged pseudo-gradient before the outer optimizer takes it (IsoLoCo's merge).
  virtual void merge(Tensor& delta) {}

  Tensor delta_;
  std::vector<comm::MatrixSpan> mats_;  // the model's matrices in the flat buffer (for GIFT)
};

std::unique_ptr<LowComm> make_diloco(const LowCommConfig& c, parallel::Mesh& mesh, comm::Communicator* world,
                                     Config& cfg);
// streaming_diloco.cpp, isoloco.cpp
std::unique_ptr<LowComm> make_streaming_diloco(const LowCommConfig& c, parallel::Mesh& mesh,
                                               comm::Communicator* world, Config& cfg);
std::unique_ptr<LowComm> make_isoloco(const LowCommConfig& c, parallel::Mesh& mesh, comm::Communicator* world,
                                      Config& cfg);

}  // namespace atl::lowcomm
