package credentials

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ichor-dev/ichor-policy/engine"
)

// An API server that answers every write with a timeout has the request
// decided again at each retry: the answers of unknown outcome kept for it
// are bounded, the oldest going first, and a record known owed (an answer
// stored, its record refused) is never among those dropped.
func TestTheUncertainAnswersKeptForARequestAreBounded(t *testing.T) {
	var o owedRecords
	key := types.NamespacedName{Namespace: "ns", Name: "req"}
	o.add(key, owedRecord{uid: "old", record: engine.Applied{DecisionID: "stored"}})
	for i := range maxUncertain + 4 {
		o.add(key, owedRecord{uid: "u", record: engine.Applied{DecisionID: fmt.Sprint(i)}, uncertain: true})
	}
	owed := o.take(key)
	var ids []string
	for _, e := range owed {
		ids = append(ids, e.record.DecisionID)
	}
	assert.Len(t, owed, maxUncertain+1)
	assert.Equal(t, "stored", ids[0], "the record known owed is kept")
	assert.Equal(t, "4", ids[1], "the oldest uncertain answers went first")
	assert.Equal(t, fmt.Sprint(maxUncertain+3), ids[len(ids)-1])
	assert.Empty(t, o.take(key), "taken")
}
