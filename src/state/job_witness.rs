//! The mandatory mode's witness (`limits::group::Witness`): what the driver says the job's
//! processes hold on a GPU. NVML lists each compute process and its bytes; a process is the
//! job's when its cgroup path names the job (`base::job::job_of_cgroups`, which the kernel
//! keeps and the user cannot forge), as this process's own membership was read.

use crate::base::job::job_of_pid as job_of;
use crate::limits::group::Witness;

pub struct JobWitness {
    pub job: String,
}

impl Witness for JobWitness {
    fn job_holds(&self, uuid: &[u8; 16]) -> Option<(u64, u64)> {
        let procs = crate::driver::nvml::processes(uuid)?;
        let (mut bytes, mut n) = (0u64, 0u64);
        for &(pid, used) in &procs {
            if job_of(pid).as_deref() == Some(self.job.as_str()) {
                bytes = bytes.saturating_add(used);
                n += 1;
            }
        }
        Some((bytes, n))
    }

    fn name(&self) -> String {
        format!("job {}", self.job)
    }
}
