#include "train/task.h"

namespace atl {

Registry<TaskFactory>& task_registry() {
  static Registry<TaskFactory> r("task");
  return r;
}

}  // namespace atl
